//! Heartbeats: each rank tells its two neighbours on the group's ring, once per interval,
//! that it is alive, in a UDP datagram from a thread of its own, and fails the group (through
//! its abort signal) naming a neighbour it has not heard from for `misses` intervals. A group
//! failed on one rank, for any reason, is spread by that rank to its fingers (the ranks 1, 2,
//! 4, ... places on along the ring), each of which spreads it in turn on first hearing, so
//! every rank learns it within O(log world) hops: a rank sends O(1) datagrams per interval
//! whatever the world (two beats; O(log world) once, on a failure), as membership protocols
//! in the SWIM family do.
//!
//! A peer that dies is already named at once by its socket's EOF; heartbeats catch what gives
//! no EOF: a cut link, a frozen (SIGSTOPped) process, a host gone without a FIN. They travel
//! apart from the data, so a long transfer never delays them and they never interleave with a
//! frame; a rank busy computing (not calling collectives) still beats, from this thread.
//!
//! Each rank's UDP socket has the port number of its TCP listener (see `tcp/connect.rs`), so a
//! rank knows where every peer's is from the addresses they published; a datagram counts only
//! from the address of that rank's TCP connection. It carries the sender's status (`wire.rs`):
//! the last collective it entered on the group, and what it is doing on any group and since
//! when (from the flight recorder, see [`crate::recorder::status`]). A timeout asks the ranks
//! it names for theirs at once ([`Heartbeat::ask`]), to say what a missing rank is doing
//! instead. A rank that leaves says goodbye and is no longer watched.
//!
//! Under `RUSTDIST_AUTH_KEY` a datagram also carries the sender's count of datagrams sent and
//! an HMAC-SHA256 over all of it: one without the key's tag, or whose count is not above the
//! last one accepted from that rank (a replay), is ignored, so nobody without the key can keep
//! a silent rank looking alive, make a peer leave, fail the group or put words in its status.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::AuthKey;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::recorder::{self, Status};
use wire::{decode, encode, Said, ASK, BEAT, GOODBYE, MAX_LEN};

pub use wire::Identity;

mod query;
#[cfg(test)]
mod tests;
mod wire;

pub use query::ask_status;

/// Beats after a failure during which a rank also tells its fingers (datagrams get lost).
const SPREAD_BEATS: u32 = 3;

/// How often a rank beats and how many missed beats fail the group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeartbeatConfig {
    pub interval: Duration,
    pub misses: u32,
}

impl HeartbeatConfig {
    /// From `RUSTDIST_HEARTBEAT_INTERVAL` (seconds, default 1; 0 turns heartbeats off) and
    /// `RUSTDIST_HEARTBEAT_MISSES` (default 5): a silent peer is named within about 6 s.
    pub fn from_env() -> Result<Option<HeartbeatConfig>> {
        let interval = match std::env::var("RUSTDIST_HEARTBEAT_INTERVAL") {
            Ok(v) => match v.trim().parse::<f64>() {
                Ok(0.0) => return Ok(None),
                Ok(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s),
                _ => {
                    return Err(Error::invalid(format!(
                    "RUSTDIST_HEARTBEAT_INTERVAL must be a number of seconds (0 = off), not {v:?}"
                )))
                }
            },
            Err(_) => Duration::from_secs(1),
        };
        let misses = match std::env::var("RUSTDIST_HEARTBEAT_MISSES") {
            Ok(v) => v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&m| m > 0)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "RUSTDIST_HEARTBEAT_MISSES must be a positive integer, not {v:?}"
                    ))
                })?,
            Err(_) => 5,
        };
        Ok(Some(HeartbeatConfig { interval, misses }))
    }
}

/// What a peer last said it was doing (see [`Heartbeat::peer_status`]).
#[derive(Debug, Clone)]
pub struct PeerStatus {
    /// The last collective it entered on the group.
    pub entered: u64,
    /// Its latest operation on any group, in words.
    pub activity: String,
    /// How long ago that operation was issued, as of now.
    pub age: Duration,
}

/// The running heartbeat of one group; stops (saying goodbye) when dropped.
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    /// The thread's socket: wakes it from its receive when stopping, and sends asks.
    sock: UdpSocket,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// What the thread and the handle share.
struct Shared {
    id: Identity,
    key: Option<AuthKey>,
    watch: Mutex<Watch>,
    /// Signalled whenever a peer's status arrives (an ask waits on it).
    heard: Condvar,
    /// Datagrams signed so far: the next one's count (receivers take only rising counts).
    sent: AtomicU64,
}

impl Shared {
    fn datagram(&self, kind: u32, said: &Said) -> Vec<u8> {
        let count = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
        encode(kind, &self.id, said, self.key.as_ref(), count)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watch> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.watch.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whom the thread watches and whom it tells: changed when the group is shrunk.
struct Watch {
    /// The group failed when a peer goes silent.
    cancel: Arc<Cancel>,
    /// Each rank's number in the group the heartbeats now serve (None: no longer watched),
    /// by its number in the group they started in, which the datagrams keep carrying.
    names: Vec<Option<usize>>,
    /// The id of the group served now, whose flight recorder the beats report.
    group: u32,
    /// What each peer last said, and when it was heard, by its first number.
    statuses: Vec<Option<(Status, Instant)>>,
    /// By first number (None for this rank and those a shrink left out).
    peers: Vec<Option<Peer>>,
    /// What this rank said last.
    said: Said,
}

impl Watch {
    /// The first numbers of the ranks of the group served now, in that group's order.
    fn members(&self) -> Vec<usize> {
        let mut order: Vec<(usize, usize)> = (self.names.iter().enumerate())
            .filter_map(|(first, name)| name.map(|n| (n, first)))
            .collect();
        order.sort_unstable();
        order.into_iter().map(|(_, first)| first).collect()
    }

    /// The peers `me` beats to and watches: its neighbours on the ring of the group served now.
    fn neighbours(&self, me: usize) -> Vec<usize> {
        let members = self.members();
        let n = members.len();
        along_ring(&members, me, [1, n.saturating_sub(1)])
    }

    /// The peers `me` tells of a failure: 1, 2, 4, ... places on along the ring (from each of
    /// which the news goes on the same way, so that it reaches every rank in log2(n) hops),
    /// and its neighbours.
    fn fingers(&self, me: usize) -> Vec<usize> {
        let members = self.members();
        let n = members.len();
        let hops = std::iter::successors(Some(1usize), |h| h.checked_mul(2)).take_while(|&h| h < n);
        along_ring(&members, me, hops.chain([n.saturating_sub(1)]))
    }

    /// Where peer `first`'s datagrams go, if known.
    fn addr(&self, first: usize) -> Option<SocketAddr> {
        self.peers.get(first)?.as_ref()?.addr
    }
}

/// The members `offsets` places after `me` along the ring of `members` (first numbers), each
/// once and never `me`.
fn along_ring(
    members: &[usize],
    me: usize,
    offsets: impl IntoIterator<Item = usize>,
) -> Vec<usize> {
    let Some(at) = members.iter().position(|&m| m == me) else {
        return Vec::new();
    };
    let mut out: Vec<usize> = Vec::new();
    for off in offsets {
        let p = members[(at + off) % members.len()];
        if p != me && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

struct Peer {
    /// Where its UDP socket is.
    addr: Option<SocketAddr>,
    /// The IP its TCP connection comes from: datagrams claiming this rank must too.
    ip: IpAddr,
    heard: Instant,
    left: bool,
    /// The count of the last signed datagram accepted from it (replays are not above it).
    count: u64,
}

impl Heartbeat {
    /// Starts beating on `sock` for the peers at `peer_ips` (`None` for this rank), whose UDP
    /// addresses are `addrs` where known (else learnt from their datagrams), raising `cancel`
    /// when a watched one goes silent; datagrams are signed and checked with `key` when set.
    pub fn start(
        sock: UdpSocket,
        id: Identity,
        peer_ips: &[Option<IpAddr>],
        addrs: &[Option<SocketAddr>],
        config: HeartbeatConfig,
        key: Option<AuthKey>,
        cancel: Arc<Cancel>,
    ) -> Result<Heartbeat> {
        let now = Instant::now();
        let peers: Vec<Option<Peer>> = peer_ips
            .iter()
            .zip(addrs)
            .map(|(ip, addr)| {
                ip.map(|ip| Peer {
                    addr: *addr,
                    ip,
                    heard: now,
                    left: false,
                    count: 0,
                })
            })
            .collect();
        let thread_sock = sock
            .try_clone()
            .map_err(|e| Error::network(format!("cannot share the heartbeat socket: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let shared = Arc::new(Shared {
            id,
            key,
            watch: Mutex::new(Watch {
                cancel,
                names: (0..id.size).map(Some).collect(),
                group: id.group,
                statuses: vec![None; id.size],
                peers,
                said: Said::new(id.group, recorder::status(id.group), None),
            }),
            heard: Condvar::new(),
            sent: AtomicU64::new(0),
        });
        let beating = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rustdist-hb-{}", id.rank))
            .spawn(move || beat(thread_sock, &beating, config, &stopping))
            .map_err(|e| Error::Runtime(format!("cannot start the heartbeat thread: {e}")))?;
        Ok(Heartbeat {
            stop,
            sock,
            thread: Some(thread),
            shared,
        })
    }

    /// Where this rank's datagrams come from and status queries are answered.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.sock.local_addr().ok()
    }

    /// Serves the group shrunk to `keep` (ranks of the group served now, in the new group's
    /// order), whose id is `group`, failing it through `cancel`: the ranks left out are no
    /// longer watched or beaten to, and a silent rank is named by its new number. Datagrams
    /// keep their first group's numbers and id, so peers that shrink a moment later still
    /// recognise them.
    pub fn shrink(&self, keep: &[usize], group: u32, cancel: Arc<Cancel>) {
        let mut watch = self.shared.lock();
        let mut names = vec![None; watch.names.len()];
        for (new, &served) in keep.iter().enumerate() {
            if let Some(first) = watch.names.iter().position(|&n| n == Some(served)) {
                names[first] = Some(new);
            }
        }
        for (first, peer) in watch.peers.iter_mut().enumerate() {
            if names[first].is_none() {
                *peer = None;
            }
        }
        watch.statuses = vec![None; names.len()];
        watch.names = names;
        watch.cancel = cancel;
        watch.group = group;
    }

    /// What peer `rank` (its number in the group served now) said in its latest datagram;
    /// None before it said anything.
    pub fn peer_status(&self, rank: usize) -> Option<PeerStatus> {
        let watch = self.shared.lock();
        let first = watch.names.iter().position(|&n| n == Some(rank))?;
        let (status, heard) = watch.statuses[first].as_ref()?;
        Some(PeerStatus {
            entered: status.entered,
            activity: status.activity.clone(),
            age: Duration::from_millis(status.age_ms) + heard.elapsed(),
        })
    }

    /// Asks peers `ranks` (numbers in the group served now) for their status and waits until
    /// each has answered or `within` passes: only neighbours beat to this rank, so what the
    /// others last said may be old or unknown.
    pub fn ask(&self, ranks: &[usize], within: Duration) {
        let asked = Instant::now();
        let mut watch = self.shared.lock();
        let firsts: Vec<usize> = (ranks.iter())
            .filter_map(|&r| watch.names.iter().position(|&n| n == Some(r)))
            .filter(|&first| first != self.shared.id.rank)
            .collect();
        let datagram = self.shared.datagram(ASK, &watch.said);
        for addr in firsts.iter().filter_map(|&first| watch.addr(first)) {
            // A lost ask or answer leaves that rank's old status, as before asking.
            let _ = self.sock.send_to(&datagram, addr);
        }
        let answered = |w: &Watch| {
            (firsts.iter()).all(|&f| w.statuses[f].as_ref().is_some_and(|(_, at)| *at >= asked))
        };
        while !answered(&watch) {
            let Some(left) = within.checked_sub(asked.elapsed()) else {
                return;
            };
            watch = (self.shared.heard.wait_timeout(watch, left))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Any datagram wakes the thread from its receive; it then sees `stop`.
        if let Ok(own) = self.sock.local_addr() {
            let _ = self.sock.send_to(&[0], own);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send_to(sock: &UdpSocket, watch: &Watch, to: &[usize], datagram: &[u8]) {
    for addr in to.iter().filter_map(|&p| watch.addr(p)) {
        // A lost or refused datagram is what the receiver's miss count is for.
        let _ = sock.send_to(datagram, addr);
    }
}

/// Fails the group with `e`, the fingers told first: once it has failed, this process may end
/// its operation and exit before the next beat passes the news on, and the ranks whose links
/// to it are not made yet (or not read) would learn nothing until their timeout.
fn fail_group(sock: &UdpSocket, shared: &Shared, watch: &Watch, e: Error) {
    let said = Said::new(watch.group, watch.said.status.clone(), Some(&e));
    let fingers = watch.fingers(shared.id.rank);
    send_to(sock, watch, &fingers, &shared.datagram(BEAT, &said));
    watch.cancel.raise(e);
}

/// One beat: what this rank says now, sent to its neighbours (and its fingers while a
/// failure is being spread); then the watched neighbours' silence checked. Returns the
/// neighbours watched from now on.
fn tick(
    sock: &UdpSocket,
    shared: &Shared,
    config: HeartbeatConfig,
    watched: &[usize],
    spreading: &mut Option<u32>,
) -> Vec<usize> {
    let me = shared.id.rank;
    // Outside the lock: it looks through every group's recorder.
    let served = shared.lock().group;
    let status = recorder::status(served);
    let mut watch = shared.lock();
    let failure = watch.cancel.check().err();
    watch.said = Said::new(watch.group, status, failure.as_ref());
    let now = Instant::now();
    let neighbours = watch.neighbours(me);
    for &p in neighbours.iter().filter(|p| !watched.contains(p)) {
        // Newly watched (a shrink moved the ring): silent from now on, not from the start.
        if let Some(peer) = watch.peers[p].as_mut() {
            peer.heard = now;
        }
    }
    let mut to = neighbours.clone();
    if failure.is_some() {
        let left = spreading.get_or_insert(SPREAD_BEATS);
        if *left > 0 {
            *left -= 1;
            to = watch.fingers(me);
        }
    }
    let datagram = shared.datagram(BEAT, &watch.said);
    send_to(sock, &watch, &to, &datagram);
    if watch.cancel.is_raised() {
        return neighbours;
    }
    let silence = config.interval * config.misses;
    let silent = (neighbours.iter())
        .filter_map(|&p| watch.peers[p].as_ref().map(|x| (p, x)))
        .find(|(_, x)| !x.left && now.duration_since(x.heard) > silence);
    if let Some((p, peer)) = silent {
        let name = |r: usize| watch.names[r].unwrap_or(r);
        let why = format!(
            "rank {} (host {}) has been silent for {:.1} s: no heartbeat reached \
             rank {} (a cut link, a frozen process or a host gone); the group is failed",
            name(p),
            peer.ip,
            now.duration_since(peer.heard).as_secs_f64(),
            name(me)
        );
        fail_group(sock, shared, &watch, Error::network(why.clone()));
        drop(watch);
        recorder::dump_after_failure(&why);
    }
    neighbours
}

/// Takes one datagram from `from`: the peer it names is heard, its status kept, its group's
/// failure learnt (and the news passed on at the next beat, which is now: returns true), an
/// ask answered.
fn take(sock: &UdpSocket, shared: &Shared, b: &[u8], from: SocketAddr) -> bool {
    let key = shared.key.as_ref();
    if let Some(nonce) = query::decode_query(b, key) {
        answer_query(sock, key, &nonce, from);
        return false;
    }
    let Some(datagram) = decode(b, &shared.id, key) else {
        return false;
    };
    let mut w = shared.lock();
    let Some(peer) = w.peers[datagram.rank]
        .as_mut()
        .filter(|p| p.ip == from.ip() && (key.is_none() || datagram.count > p.count))
    else {
        return false;
    };
    peer.count = datagram.count;
    peer.heard = Instant::now();
    peer.addr.get_or_insert(from);
    peer.left |= datagram.kind == GOODBYE;
    let heard = peer.heard;
    // A peer whose group (the same one: not one a shrink has replaced on either side)
    // failed: it has failed here too, and this rank may be blocked elsewhere, where its
    // peers' abort frames on this group go unread; it dumps its flight recorder now and
    // passes the news on at once.
    let name = w.names[datagram.rank].unwrap_or(datagram.rank);
    let learnt = (datagram.said.served == w.group && !w.cancel.is_raised())
        .then(|| datagram.said.learnt_failure(&format!("rank {name}")))
        .flatten();
    if let Some(e) = &learnt {
        fail_group(sock, shared, &w, e.clone());
    }
    w.statuses[datagram.rank] = Some((datagram.said.status, heard));
    shared.heard.notify_all();
    drop(w);
    if datagram.kind == ASK {
        // Outside the lock: it looks through every group's recorder.
        let served = shared.lock().group;
        let status = recorder::status(served);
        let w = shared.lock();
        let failure = w.cancel.check().err();
        let answer = shared.datagram(BEAT, &Said::new(w.group, status, failure.as_ref()));
        drop(w);
        let _ = sock.send_to(&answer, from);
    }
    if let Some(e) = &learnt {
        recorder::dump_after_failure(&e.to_string());
    }
    learnt.is_some()
}

/// Answers a status query from `from` with what every group of the process is doing.
fn answer_query(sock: &UdpSocket, key: Option<&AuthKey>, nonce: &query::Nonce, from: SocketAddr) {
    let Ok(mut body) = serde_json::to_vec(&recorder::snapshot()) else {
        return;
    };
    if body.len() > query::MAX_ANSWER {
        // Too many groups for one datagram: the process alone.
        let mut state = recorder::snapshot();
        state.groups.truncate(1);
        body = serde_json::to_vec(&state).unwrap_or_default();
    }
    let _ = sock.send_to(&query::encode_answer(nonce, &body, key), from);
}

/// Forgets the silence of every peer: this thread itself did not run for longer than a peer
/// may be silent (the machine overloaded, the process stopped and continued), so what it did
/// not hear says nothing of them.
fn forgive(shared: &Shared) {
    let now = Instant::now();
    for peer in shared.lock().peers.iter_mut().flatten() {
        peer.heard = now;
    }
}

/// The heartbeat thread.
fn beat(sock: UdpSocket, shared: &Shared, config: HeartbeatConfig, stop: &AtomicBool) {
    let silence = config.interval * config.misses;
    let mut next = Instant::now();
    let mut last_tick = Instant::now();
    let mut buf = [0u8; 2 * MAX_LEN];
    let mut watched: Vec<usize> = Vec::new();
    // Beats left of telling the fingers of the failure (None: no failure seen yet).
    let mut spreading: Option<u32> = None;
    while !stop.load(Ordering::Acquire) {
        if Instant::now() >= next {
            // What arrived while this thread waited for a core counts before any silence does.
            if sock.set_nonblocking(true).is_err() {
                return;
            }
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                take(&sock, shared, &buf[..n], from);
            }
            if sock.set_nonblocking(false).is_err() {
                return;
            }
            if last_tick.elapsed() > silence {
                forgive(shared);
            }
            watched = tick(&sock, shared, config, &watched, &mut spreading);
            last_tick = Instant::now();
            next = last_tick + config.interval;
        }
        let wait = next.saturating_duration_since(Instant::now());
        if sock
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .is_err()
        {
            return;
        }
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        if take(&sock, shared, &buf[..n], from) {
            next = Instant::now();
        }
    }
    let watch = shared.lock();
    let goodbye = shared.datagram(GOODBYE, &watch.said);
    send_to(&sock, &watch, &watched, &goodbye);
}
