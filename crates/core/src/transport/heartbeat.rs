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
//! address of that rank's TCP connection). A datagram is 24 bytes: magic, kind, job, group,
//! rank; anything else is ignored. A rank that leaves says goodbye and is no longer watched.
//!
//! Under `RUSTDIST_AUTH_KEY` a datagram also carries the sender's count of datagrams sent and
//! an HMAC-SHA256 over all of it: one without the key's tag, or whose count is not above the
//! last one accepted from that rank (a replay), is ignored, so nobody without the key can keep
//! a silent rank looking alive or make a peer leave.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::{AuthKey, TAG_LEN};
use crate::cancel::Cancel;
use crate::error::{Error, Result};

const MAGIC: u32 = 0x5244_4842; // "RDHB"
const BEAT: u32 = 1;
const GOODBYE: u32 = 2;
const DATAGRAM_LEN: usize = 24;
/// A signed datagram: the plain one, the sender's count, the tag.
const SIGNED_LEN: usize = DATAGRAM_LEN + 8 + TAG_LEN;
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

/// Rank `id`'s datagram of `kind`; signed with `key` (with the sender's `count`) when set.
fn encode(kind: u32, id: &Identity, key: Option<&AuthKey>, count: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(SIGNED_LEN);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&kind.to_le_bytes());
    b.extend_from_slice(&id.job.to_le_bytes());
    b.extend_from_slice(&id.group.to_le_bytes());
    b.extend_from_slice(&(id.rank as u32).to_le_bytes());
    if let Some(key) = key {
        b.extend_from_slice(&count.to_le_bytes());
        let tag = key.tag(LABEL, &[&b]);
        b.extend_from_slice(&tag);
    }
    b
}

/// The kind, rank and count (0 unsigned) of a datagram of this job and group, its tag checked
/// under `key` when set; `None` for anything else.
fn decode(b: &[u8], id: &Identity, key: Option<&AuthKey>) -> Option<(u32, usize, u64)> {
    let count = match key {
        None if b.len() == DATAGRAM_LEN => 0,
        Some(key) if b.len() == SIGNED_LEN => {
            let (signed, tag) = b.split_at(DATAGRAM_LEN + 8);
            if !key.verify(LABEL, &[signed], tag) {
                return None;
            }
            u64::from_le_bytes(signed[DATAGRAM_LEN..].try_into().ok()?)
        }
        _ => return None,
    };
    let b: &[u8; DATAGRAM_LEN] = b[..DATAGRAM_LEN].try_into().ok()?;
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let job = u64::from_le_bytes(b[8..16].try_into().ok()?);
    let rank = word(20) as usize;
    let kind = word(4);
    (word(0) == MAGIC
        && job == id.job
        && word(16) == id.group
        && rank < id.size
        && rank != id.rank
        && (kind == BEAT || kind == GOODBYE))
        .then_some((kind, rank, count))
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
    /// order), failing it through `cancel`: the ranks left out are no longer watched or
    /// beaten to, and a silent rank is named by its new number. Datagrams keep their first
    /// group's numbers and id, so peers that shrink a moment later still recognise them.
    pub fn shrink(&self, keep: &[usize], cancel: Arc<Cancel>) {
        let mut watch = Watch::lock(&self.watch);
        let mut names = vec![None; watch.names.len()];
        for (new, &served) in keep.iter().enumerate() {
            if let Some(first) = watch.names.iter().position(|&n| n == Some(served)) {
                names[first] = Some(new);
            }
        }
        *watch = Watch { cancel, names };
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
    let mut buf = [0u8; 2 * SIGNED_LEN];
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now >= next {
            let watch = Watch::lock(watch);
            for (p, peer) in peers.iter_mut().enumerate() {
                if watch.names[p].is_none() {
                    *peer = None; // left out of the group by a shrink
                }
            }
            sent += 1;
            send_all(&sock, &peers, &encode(BEAT, &id, key, sent));
            next = now + config.interval;
            if !watch.cancel.is_raised() {
                if let Some((p, peer)) = peers
                    .iter()
                    .enumerate()
                    .filter_map(|(p, x)| x.as_ref().map(|x| (p, x)))
                    .find(|(_, x)| !x.left && now.duration_since(x.heard) > silence)
                {
                    let name = |r: usize| watch.names[r].unwrap_or(r);
                    watch.cancel.raise(Error::network(format!(
                        "rank {} (host {}) has been silent for {:.1} s: no heartbeat reached \
                         rank {} (a cut link, a frozen process or a host gone); the group is failed",
                        name(p),
                        peer.ip,
                        now.duration_since(peer.heard).as_secs_f64(),
                        name(id.rank)
                    )));
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
        let Some((kind, rank, count)) = decode(&buf[..n], &id, key) else {
            continue;
        };
        let Some(peer) = peers[rank]
            .as_mut()
            .filter(|p| p.ip == from.ip() && (key.is_none() || count > p.count))
        else {
            continue;
        };
        peer.count = count;
        peer.heard = Instant::now();
        peer.addr.get_or_insert(from);
        peer.left |= kind == GOODBYE;
    }
    send_all(&sock, &peers, &encode(GOODBYE, &id, key, sent + 1));
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

    #[test]
    fn datagrams_of_other_jobs_groups_and_ranks_are_ignored() {
        let b = encode(BEAT, &id(1), None, 0);
        assert_eq!(decode(&b, &id(0), None), Some((BEAT, 1, 0)));
        assert_eq!(decode(&b, &id(1), None), None, "from itself");
        assert_eq!(decode(&b[..23], &id(0), None), None, "short");
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
        let signed = encode(BEAT, &id(1), Some(&key), 7);
        assert_eq!(decode(&signed, &id(0), Some(&key)), Some((BEAT, 1, 7)));
        assert_eq!(decode(&signed, &id(0), Some(&other)), None, "another key");
        let plain = encode(BEAT, &id(1), None, 0);
        assert_eq!(decode(&plain, &id(0), Some(&key)), None, "unsigned");
        assert_eq!(
            decode(&signed, &id(0), None),
            None,
            "signed without a key here"
        );
        for i in [4, 20, 24, 40] {
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
    fn a_shrink_stops_watching_the_ranks_it_leaves_out() {
        let frozen = udp();
        let (up, old_cancel) = upper(frozen.local_addr().unwrap(), FAST, None);
        // Rank 0 never beats; rank 1 shrinks the group to itself before the silence counts.
        let cancel = Arc::new(Cancel::default());
        up.shrink(&[1], cancel.clone());
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
        let mut buf = [0u8; 64];
        frozen
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let (n, _) = frozen.recv_from(&mut buf).unwrap();
        assert_eq!(decode(&buf[..n], &id(0), None), Some((BEAT, 1, 0)));
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
        let genuine = encode(BEAT, &id(0), key.as_ref(), 1);
        let attacker = udp();
        frozen
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut buf = [0u8; 128];
        let (_, rank1) = frozen.recv_from(&mut buf).unwrap();
        let end = Instant::now() + FAST.interval * 20;
        while Instant::now() < end && !cancel.is_raised() {
            let _ = attacker.send_to(&genuine, rank1);
            let _ = attacker.send_to(&encode(BEAT, &id(0), None, 0), rank1);
            std::thread::sleep(FAST.interval / 2);
        }
        // Sent from the attacker's socket on 127.0.0.1 like rank 0's: only the count and the
        // tag keep them out (the first replay is accepted once, then never again).
        assert!(raised_within(&cancel, FAST.interval * 20));
    }
}
