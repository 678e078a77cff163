//! Heartbeats: every rank tells every peer, once per interval, that it is alive, in a UDP
//! datagram from a thread of its own, and fails the group (through its abort signal) naming
//! the first peer it has not heard from for `misses` intervals.
//!
//! A peer that dies is already named at once by its socket's EOF; heartbeats catch what gives
//! no EOF: a cut link, a frozen (SIGSTOPped) process, a host gone without a FIN. They travel
//! apart from the data, so a long transfer never delays them and they never interleave with a
//! frame; a rank busy computing (not calling collectives) still beats, from this thread.
//!
//! Each rank's UDP socket has the port number of its TCP listener (see `tcp/connect.rs`), so a rank
//! knows where the lower ranks listen from their published addresses; the higher ranks are
//! learnt from their first datagram (checked against the job, the group, the rank and the
//! address of that rank's TCP connection). A datagram is a 24-byte header (magic, kind, job,
//! group, rank) and the sender's status: the last collective it entered on the group, and
//! what it is doing on any group and since when (from the flight recorder, see
//! [`crate::recorder::status`]), which a timeout quotes to say what a missing rank is doing
//! instead; anything else is ignored. A rank that leaves says goodbye and is no longer watched.
//!
//! Under `RUSTDIST_AUTH_KEY` a datagram also carries the sender's count of datagrams sent and
//! an HMAC-SHA256 over all of it: one without the key's tag, or whose count is not above the
//! last one accepted from that rank (a replay), is ignored, so nobody without the key can keep
//! a silent rank looking alive, make a peer leave, or put words in its status.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::{AuthKey, TAG_LEN};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::recorder::{self, Status, MAX_ACTIVITY};

const MAGIC: u32 = 0x5244_4842; // "RDHB"
const BEAT: u32 = 1;
const GOODBYE: u32 = 2;
const HEADER_LEN: usize = 24;
/// The status after the header: the id of the group served now and whether it has failed,
/// the collective entered, the activity's age in ms, the text's length, the text.
const STATUS_LEN: usize = 4 + 1 + 8 + 8 + 2;
/// The longest datagram: the header, the longest status and failure, the sender's count, the
/// tag.
const MAX_LEN: usize = HEADER_LEN + STATUS_LEN + MAX_ACTIVITY + 2 + MAX_ACTIVITY + 8 + TAG_LEN;
/// The HMAC label of heartbeats (apart from the connection handshakes').
const LABEL: &[u8] = b"rustdist heartbeat v1";

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

/// Who this rank is, for the datagrams it sends and accepts.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub job: u64,
    pub group: u32,
    pub rank: usize,
    pub size: usize,
}

/// What a rank says in each datagram besides who it is.
#[derive(Debug, Clone, PartialEq)]
struct Said {
    /// The id of the group its heartbeats serve now (the first one's until a shrink).
    served: u32,
    /// That group has failed on it (a timeout, a dead peer, an abort): it has failed on every
    /// rank then, and the ones that are elsewhere learn it here (see `beat`).
    failed: bool,
    status: Status,
    /// Why it failed (the start of its error), when it has.
    reason: String,
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Rank `id`'s datagram of `kind` saying `said`; signed with `key` (with the sender's `count`)
/// when set.
fn encode(kind: u32, id: &Identity, said: &Said, key: Option<&AuthKey>, count: u64) -> Vec<u8> {
    let status = &said.status;
    let text = cut(&status.activity, MAX_ACTIVITY).as_bytes();
    let reason = cut(&said.reason, MAX_ACTIVITY).as_bytes();
    let mut b = Vec::with_capacity(MAX_LEN);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&kind.to_le_bytes());
    b.extend_from_slice(&id.job.to_le_bytes());
    b.extend_from_slice(&id.group.to_le_bytes());
    b.extend_from_slice(&(id.rank as u32).to_le_bytes());
    b.extend_from_slice(&said.served.to_le_bytes());
    b.push(said.failed as u8);
    b.extend_from_slice(&status.entered.to_le_bytes());
    b.extend_from_slice(&status.age_ms.to_le_bytes());
    b.extend_from_slice(&(text.len() as u16).to_le_bytes());
    b.extend_from_slice(text);
    b.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    b.extend_from_slice(reason);
    if let Some(key) = key {
        b.extend_from_slice(&count.to_le_bytes());
        let tag = key.tag(LABEL, &[&b]);
        b.extend_from_slice(&tag);
    }
    b
}

/// A datagram of this job and group from a peer.
#[derive(Debug, PartialEq)]
struct Datagram {
    kind: u32,
    rank: usize,
    /// The sender's count (0 unsigned).
    count: u64,
    said: Said,
}

/// The datagram in `b` when it is one of this job and group, its tag checked under `key` when
/// set; `None` for anything else.
fn decode(b: &[u8], id: &Identity, key: Option<&AuthKey>) -> Option<Datagram> {
    let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
    let word = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
    let len_at = |i: usize| Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?) as usize);
    let at = HEADER_LEN + STATUS_LEN;
    let text_end = at + len_at(at - 2)?;
    let plain = text_end + 2 + len_at(text_end)?;
    let count = match key {
        None if b.len() == plain => 0,
        Some(key) if b.len() == plain + 8 + TAG_LEN => {
            let (signed, tag) = b.split_at(plain + 8);
            if !key.verify(LABEL, &[signed], tag) {
                return None;
            }
            u64_at(plain)?
        }
        _ => return None,
    };
    let rank = word(20)? as usize;
    let kind = word(4)?;
    let ours = word(0)? == MAGIC
        && u64_at(8)? == id.job
        && word(16)? == id.group
        && rank < id.size
        && rank != id.rank
        && (kind == BEAT || kind == GOODBYE);
    if !ours {
        return None;
    }
    Some(Datagram {
        kind,
        rank,
        count,
        said: Said {
            served: word(HEADER_LEN)?,
            failed: *b.get(HEADER_LEN + 4)? != 0,
            status: Status {
                entered: u64_at(HEADER_LEN + 5)?,
                age_ms: u64_at(HEADER_LEN + 13)?,
                activity: String::from_utf8_lossy(&b[at..text_end]).into_owned(),
            },
            reason: String::from_utf8_lossy(&b[text_end + 2..plain]).into_owned(),
        },
    })
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
    /// The thread's socket, to wake it from its receive when stopping.
    waker: UdpSocket,
    thread: Option<JoinHandle<()>>,
    watch: Arc<Mutex<Watch>>,
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
}

impl Watch {
    fn lock(watch: &Mutex<Watch>) -> std::sync::MutexGuard<'_, Watch> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        watch.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Peer {
    /// Where its UDP socket is, once known.
    addr: Option<SocketAddr>,
    /// The IP its TCP connection comes from: datagrams claiming this rank must too.
    ip: IpAddr,
    heard: Instant,
    left: bool,
    /// The count of the last signed datagram accepted from it (replays are not above it).
    count: u64,
}

impl Heartbeat {
    /// Starts beating on `sock` to the peers at `peer_ips` (`None` for this rank; the UDP
    /// addresses of the lower ranks in `known`), raising `cancel` when one goes silent;
    /// datagrams are signed and checked with `key` when set.
    pub fn start(
        sock: UdpSocket,
        id: Identity,
        peer_ips: &[Option<IpAddr>],
        known: &[Option<SocketAddr>],
        config: HeartbeatConfig,
        key: Option<AuthKey>,
        cancel: Arc<Cancel>,
    ) -> Result<Heartbeat> {
        let now = Instant::now();
        let peers: Vec<Option<Peer>> = peer_ips
            .iter()
            .zip(known)
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
        let waker = sock
            .try_clone()
            .map_err(|e| Error::network(format!("cannot share the heartbeat socket: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let watch = Arc::new(Mutex::new(Watch {
            cancel,
            names: (0..id.size).map(Some).collect(),
            group: id.group,
            statuses: vec![None; id.size],
        }));
        let watching = watch.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rustdist-hb-{}", id.rank))
            .spawn(move || beat(sock, id, peers, config, key.as_ref(), &watching, &stopping))
            .map_err(|e| Error::Runtime(format!("cannot start the heartbeat thread: {e}")))?;
        Ok(Heartbeat {
            stop,
            waker,
            thread: Some(thread),
            watch,
        })
    }

    /// Serves the group shrunk to `keep` (ranks of the group served now, in the new group's
    /// order), whose id is `group`, failing it through `cancel`: the ranks left out are no
    /// longer watched or beaten to, and a silent rank is named by its new number. Datagrams
    /// keep their first group's numbers and id, so peers that shrink a moment later still
    /// recognise them.
    pub fn shrink(&self, keep: &[usize], group: u32, cancel: Arc<Cancel>) {
        let mut watch = Watch::lock(&self.watch);
        let mut names = vec![None; watch.names.len()];
        for (new, &served) in keep.iter().enumerate() {
            if let Some(first) = watch.names.iter().position(|&n| n == Some(served)) {
                names[first] = Some(new);
            }
        }
        let statuses = vec![None; names.len()];
        *watch = Watch {
            cancel,
            names,
            group,
            statuses,
        };
    }

    /// What peer `rank` (its number in the group served now) said in its latest datagram;
    /// None before it said anything.
    pub fn peer_status(&self, rank: usize) -> Option<PeerStatus> {
        let watch = Watch::lock(&self.watch);
        let first = watch.names.iter().position(|&n| n == Some(rank))?;
        let (status, heard) = watch.statuses[first].as_ref()?;
        Some(PeerStatus {
            entered: status.entered,
            activity: status.activity.clone(),
            age: Duration::from_millis(status.age_ms) + heard.elapsed(),
        })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Any datagram wakes the thread from its receive; it then sees `stop`.
        if let Ok(own) = self.waker.local_addr() {
            let _ = self.waker.send_to(&[0], own);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send_all(sock: &UdpSocket, peers: &[Option<Peer>], datagram: &[u8]) {
    for addr in peers.iter().flatten().filter_map(|p| p.addr) {
        // A lost or refused datagram is what the receiver's miss count is for.
        let _ = sock.send_to(datagram, addr);
    }
}

/// The heartbeat thread.
fn beat(
    sock: UdpSocket,
    id: Identity,
    mut peers: Vec<Option<Peer>>,
    config: HeartbeatConfig,
    key: Option<&AuthKey>,
    watch: &Mutex<Watch>,
    stop: &AtomicBool,
) {
    let silence = config.interval * config.misses;
    let mut next = Instant::now();
    let mut sent: u64 = 0;
    let mut buf = [0u8; 2 * MAX_LEN];
    let mut said = Said {
        served: id.group,
        failed: false,
        status: recorder::status(id.group),
        reason: String::new(),
    };
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now >= next {
            // Outside the lock: it looks through every group's recorder.
            let served = Watch::lock(watch).group;
            let status = recorder::status(served);
            let watch = Watch::lock(watch);
            let failure = watch.cancel.check().err();
            said = Said {
                served: watch.group,
                failed: failure.is_some(),
                status,
                reason: failure.map(|e| e.to_string()).unwrap_or_default(),
            };
            for (p, peer) in peers.iter_mut().enumerate() {
                if watch.names[p].is_none() {
                    *peer = None; // left out of the group by a shrink
                }
            }
            sent += 1;
            send_all(&sock, &peers, &encode(BEAT, &id, &said, key, sent));
            next = now + config.interval;
            if !watch.cancel.is_raised() {
                if let Some((p, peer)) = peers
                    .iter()
                    .enumerate()
                    .filter_map(|(p, x)| x.as_ref().map(|x| (p, x)))
                    .find(|(_, x)| !x.left && now.duration_since(x.heard) > silence)
                {
                    let name = |r: usize| watch.names[r].unwrap_or(r);
                    let why = format!(
                        "rank {} (host {}) has been silent for {:.1} s: no heartbeat reached \
                         rank {} (a cut link, a frozen process or a host gone); the group is failed",
                        name(p),
                        peer.ip,
                        now.duration_since(peer.heard).as_secs_f64(),
                        name(id.rank)
                    );
                    watch.cancel.raise(Error::network(why.clone()));
                    drop(watch);
                    recorder::dump_after_failure(&why);
                }
            }
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
        let Some(datagram) = decode(&buf[..n], &id, key) else {
            continue;
        };
        let Some(peer) = peers[datagram.rank]
            .as_mut()
            .filter(|p| p.ip == from.ip() && (key.is_none() || datagram.count > p.count))
        else {
            continue;
        };
        peer.count = datagram.count;
        peer.heard = Instant::now();
        peer.addr.get_or_insert(from);
        peer.left |= datagram.kind == GOODBYE;
        let mut w = Watch::lock(watch);
        // A peer whose group (the same one: not one a shrink has replaced on either side)
        // failed: it has failed here too, and this rank may be blocked elsewhere, where its
        // peers' abort frames on this group go unread; it dumps its flight recorder now.
        let name = w.names[datagram.rank].unwrap_or(datagram.rank);
        let failed_there = datagram.said.failed && datagram.said.served == w.group;
        let why = (failed_there && !w.cancel.is_raised()).then(|| {
            format!(
                "rank {name} failed: {} (learnt from its heartbeat while this rank was not in \
                 the group's operations; the group is failed on every rank)",
                datagram.said.reason
            )
        });
        if let Some(why) = &why {
            w.cancel.raise(Error::backend(why.clone()));
        }
        w.statuses[datagram.rank] = Some((datagram.said.status, peer.heard));
        drop(w);
        if let Some(why) = why {
            recorder::dump_after_failure(&why);
        }
    }
    send_all(&sock, &peers, &encode(GOODBYE, &id, &said, key, sent + 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(rank: usize) -> Identity {
        Identity {
            job: 7,
            group: 3,
            rank,
            size: 2,
        }
    }

    fn status() -> Status {
        Status {
            entered: 41,
            activity: "broadcast #17 of group 'tp' (started)".into(),
            age_ms: 1500,
        }
    }

    fn said() -> Said {
        Said {
            served: 3,
            failed: false,
            status: status(),
            reason: String::new(),
        }
    }

    fn beat_from(rank: usize, count: u64) -> Option<Datagram> {
        Some(Datagram {
            kind: BEAT,
            rank,
            count,
            said: said(),
        })
    }

    #[test]
    fn datagrams_carry_the_sender_s_status() {
        let b = encode(BEAT, &id(1), &said(), None, 0);
        assert_eq!(decode(&b, &id(0), None), beat_from(1, 0));
        let failed = Said {
            served: 9,
            failed: true,
            reason: "rank 0: all_reduce (collective #4) Timed out".into(),
            ..said()
        };
        let got = decode(&encode(BEAT, &id(1), &failed, None, 0), &id(0), None).unwrap();
        assert_eq!(got.said, failed);
        let long = Said {
            status: Status {
                activity: "x".repeat(MAX_ACTIVITY + 50),
                ..status()
            },
            ..said()
        };
        let got = decode(&encode(BEAT, &id(1), &long, None, 0), &id(0), None).unwrap();
        let kept = got.said.status.activity.len();
        assert_eq!(kept, MAX_ACTIVITY, "cut to the longest kept");
    }

    #[test]
    fn datagrams_of_other_jobs_groups_and_ranks_are_ignored() {
        let b = encode(BEAT, &id(1), &said(), None, 0);
        assert_eq!(decode(&b, &id(0), None), beat_from(1, 0));
        assert_eq!(decode(&b, &id(1), None), None, "from itself");
        assert_eq!(decode(&b[..23], &id(0), None), None, "short");
        assert_eq!(decode(&b[..b.len() - 1], &id(0), None), None, "text cut");
        let other_job = Identity { job: 8, ..id(0) };
        assert_eq!(decode(&b, &other_job, None), None);
        let other_group = Identity { group: 4, ..id(0) };
        assert_eq!(decode(&b, &other_group, None), None);
        let mut bad = b.clone();
        bad[20] = 9;
        assert_eq!(decode(&bad, &id(0), None), None, "rank out of range");
        bad = b;
        bad[4] = 3;
        assert_eq!(decode(&bad, &id(0), None), None, "unknown kind");
    }

    #[test]
    fn under_a_key_only_datagrams_signed_with_it_count() {
        let key = AuthKey::new(b"secret").unwrap();
        let other = AuthKey::new(b"other").unwrap();
        let signed = encode(BEAT, &id(1), &said(), Some(&key), 7);
        assert_eq!(decode(&signed, &id(0), Some(&key)), beat_from(1, 7));
        assert_eq!(decode(&signed, &id(0), Some(&other)), None, "another key");
        let plain = encode(BEAT, &id(1), &said(), None, 0);
        assert_eq!(decode(&plain, &id(0), Some(&key)), None, "unsigned");
        assert_eq!(
            decode(&signed, &id(0), None),
            None,
            "signed without a key here"
        );
        // The header, the status and its text are all covered by the tag.
        for i in [4, 20, 24, 28, 34, 45, signed.len() - 1] {
            let mut bad = signed.clone();
            bad[i] ^= 1;
            assert_eq!(decode(&bad, &id(0), Some(&key)), None, "byte {i} changed");
        }
    }

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn udp() -> UdpSocket {
        UdpSocket::bind((LOCAL, 0)).unwrap()
    }

    /// Rank 1 of a pair beating to `lower`, rank 0's socket.
    fn upper(
        lower: SocketAddr,
        config: HeartbeatConfig,
        key: Option<AuthKey>,
    ) -> (Heartbeat, Arc<Cancel>) {
        let cancel = Arc::new(Cancel::default());
        let beat = Heartbeat::start(
            udp(),
            id(1),
            &[Some(LOCAL), None],
            &[Some(lower), None],
            config,
            key,
            cancel.clone(),
        )
        .unwrap();
        (beat, cancel)
    }

    /// Rank 0 of a pair on `sock`, learning rank 1's address from its datagrams.
    fn lower(
        sock: UdpSocket,
        config: HeartbeatConfig,
        key: Option<AuthKey>,
    ) -> (Heartbeat, Arc<Cancel>) {
        let cancel = Arc::new(Cancel::default());
        let beat = Heartbeat::start(
            sock,
            id(0),
            &[None, Some(LOCAL)],
            &[None, None],
            config,
            key,
            cancel.clone(),
        )
        .unwrap();
        (beat, cancel)
    }

    fn raised_within(c: &Cancel, within: Duration) -> bool {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if c.is_raised() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    const FAST: HeartbeatConfig = HeartbeatConfig {
        interval: Duration::from_millis(50),
        misses: 4,
    };

    #[test]
    fn beating_peers_stay_up_and_a_departed_one_is_not_blamed() {
        let sock = udp();
        let (up, up_cancel) = upper(sock.local_addr().unwrap(), FAST, None);
        let (_low, low_cancel) = lower(sock, FAST, None);
        // Both beat (rank 0 learns rank 1's address): no failure over many silence windows.
        assert!(!raised_within(&low_cancel, FAST.interval * 16));
        assert!(!up_cancel.is_raised());
        // Rank 1 leaves with a goodbye: rank 0 does not fail.
        drop(up);
        assert!(!raised_within(&low_cancel, FAST.interval * 16));
    }

    #[test]
    fn each_rank_knows_what_its_peers_last_said() {
        let sock = udp();
        let (up, _) = upper(sock.local_addr().unwrap(), FAST, None);
        let (low, _) = lower(sock, FAST, None);
        let end = Instant::now() + Duration::from_secs(5);
        while (low.peer_status(1).is_none() || up.peer_status(0).is_none()) && Instant::now() < end
        {
            std::thread::sleep(FAST.interval);
        }
        let heard = low.peer_status(1).expect("rank 0 heard rank 1's status");
        // Neither rank has an operation in this group's recorder (group 3 has none here).
        assert_eq!(heard.entered, 0);
        assert!(up.peer_status(0).is_some());
        assert!(low.peer_status(0).is_none(), "no status of itself");
    }

    #[test]
    fn a_group_failed_on_a_peer_fails_here_unless_a_shrink_replaced_it() {
        let sock = udp();
        let (_up, up_cancel) = upper(sock.local_addr().unwrap(), FAST, None);
        let (_low, low_cancel) = lower(sock, FAST, None);
        up_cancel.raise(Error::backend("timed out"));
        assert!(raised_within(&low_cancel, FAST.interval * 20));
        let msg = low_cancel.check().unwrap_err().to_string();
        assert!(
            msg.contains("rank 1 failed: timed out (learnt from its heartbeat"),
            "{msg}"
        );

        // Rank 1 shrank to a new group; its old group's failure no longer counts.
        let sock = udp();
        let (up, up_cancel) = upper(sock.local_addr().unwrap(), FAST, None);
        let (low, low_cancel) = lower(sock, FAST, None);
        up_cancel.raise(Error::backend("failed before the shrink"));
        let fresh = Arc::new(Cancel::default());
        low.shrink(&[0, 1], 4, fresh.clone());
        assert!(!raised_within(&fresh, FAST.interval * 16));
        drop((up, low_cancel));
    }

    #[test]
    fn a_shrink_stops_watching_the_ranks_it_leaves_out() {
        let frozen = udp();
        let (up, old_cancel) = upper(frozen.local_addr().unwrap(), FAST, None);
        // Rank 0 never beats; rank 1 shrinks the group to itself before the silence counts.
        let cancel = Arc::new(Cancel::default());
        up.shrink(&[1], 3, cancel.clone());
        assert!(!raised_within(&cancel, FAST.interval * 20));
        assert!(!old_cancel.is_raised());
    }

    #[test]
    fn a_peer_that_never_beats_fails_the_group_naming_it() {
        let frozen = udp();
        let (_up, cancel) = upper(frozen.local_addr().unwrap(), FAST, None);
        assert!(raised_within(&cancel, FAST.interval * 20));
        let msg = cancel.check().unwrap_err().to_string();
        assert!(
            msg.contains("rank 0 (host 127.0.0.1) has been silent"),
            "{msg}"
        );
        // Rank 1 beat to rank 0 all along.
        let mut buf = [0u8; MAX_LEN];
        frozen
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let (n, _) = frozen.recv_from(&mut buf).unwrap();
        let got = decode(&buf[..n], &id(0), None).unwrap();
        assert_eq!((got.kind, got.rank, got.count), (BEAT, 1, 0));
    }

    #[test]
    fn under_a_key_signed_peers_stay_up_and_replayed_or_unsigned_beats_do_not_help() {
        let key = AuthKey::new(b"secret");
        let sock = udp();
        let (_up, up_cancel) = upper(sock.local_addr().unwrap(), FAST, key.clone());
        let (_low, low_cancel) = lower(sock, FAST, key.clone());
        assert!(!raised_within(&low_cancel, FAST.interval * 16));
        assert!(!up_cancel.is_raised());

        // A silent rank 0: an attacker replays one of its genuine beats and sends unsigned
        // ones to rank 1 all along, which still names rank 0.
        let frozen = udp();
        let (_up, cancel) = upper(frozen.local_addr().unwrap(), FAST, key.clone());
        let genuine = encode(BEAT, &id(0), &said(), key.as_ref(), 1);
        let attacker = udp();
        frozen
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut buf = [0u8; MAX_LEN];
        let (_, rank1) = frozen.recv_from(&mut buf).unwrap();
        let end = Instant::now() + FAST.interval * 20;
        while Instant::now() < end && !cancel.is_raised() {
            let _ = attacker.send_to(&genuine, rank1);
            let _ = attacker.send_to(&encode(BEAT, &id(0), &said(), None, 0), rank1);
            std::thread::sleep(FAST.interval / 2);
        }
        // Sent from the attacker's socket on 127.0.0.1 like rank 0's: only the count and the
        // tag keep them out (the first replay is accepted once, then never again).
        assert!(raised_within(&cancel, FAST.interval * 20));
    }
}
