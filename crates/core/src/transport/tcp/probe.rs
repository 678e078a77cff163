//! What the ranks agree about their links once the mesh stands: the one-way latency (from the
//! handshakes' round trips) and, where links join hosts, their bandwidth (timed by streaming
//! a probe around the ring) and how many streams to open per peer. Works on sockets and the
//! store only, so it needs nothing of how the mesh was made.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::poll::{poll_fds, pollfd};
use super::socket::between_hosts;
use crate::error::{Error, Result};
use crate::interrupt;
use crate::netio::timed_out;
use crate::store::Store;
use crate::timeout::remaining;

/// The links' one-way latency, the same on every rank: half the shortest handshake round
/// trip of the highest rank (which dials every lower rank it links at init: both its ring
/// neighbours, and the peers it shares memory with), published under `prefix`.
/// `round_trip` is this rank's [`Mesh::round_trip`].
///
/// [`Mesh::round_trip`]: super::Mesh::round_trip
pub fn agree_latency(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    round_trip: Option<Duration>,
    deadline: Instant,
) -> Result<Option<Duration>> {
    let key = format!("{prefix}/link_latency_ns");
    let ns = match round_trip {
        _ if size <= 1 => return Ok(None),
        Some(rt) if rank == size - 1 => {
            let ns = (rt / 2).as_nanos().to_string();
            store.set(&key, ns.as_bytes())?;
            ns
        }
        _ => String::from_utf8_lossy(&store.get(&key, remaining(deadline))?).into_owned(),
    };
    Ok(ns.parse().ok().map(Duration::from_nanos))
}

/// Bytes each rank streams to the next to time a link between hosts: long enough to leave
/// TCP's slow start on a LAN, a few ms at 1 Gbit/s.
const PROBE_BYTES: usize = 1 << 20;

/// What the ranks agreed about the links between hosts at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkAgreement {
    /// The slowest link's rate in bytes per second (None: no link joins two hosts, or it
    /// could not be timed).
    pub bandwidth: Option<u64>,
    /// Connections to each peer on another host (1 on one host).
    pub streams: usize,
}

/// Bytes one TCP stream of this host can keep in flight: half the smaller of the kernel's
/// largest send and receive buffers (`tcp_wmem`, `tcp_rmem`), which also hold bookkeeping.
/// Linux's defaults (4 MiB and 6 MiB) when they cannot be read.
pub fn stream_window() -> u64 {
    let max = |name: &str, default: u64| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
            .ok()
            .and_then(|t| t.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or(default)
    };
    max("tcp_wmem", 4 << 20).min(max("tcp_rmem", 6 << 20)) / 2
}

/// The links between hosts, the same on every rank: their bandwidth, and how many streams to
/// open to each peer across them. Each rank streams `PROBE_BYTES` over `socks` (a fresh
/// [`Mesh`]'s, before any frame) to the next rank when that link joins two hosts, while timing
/// what the previous rank streams to it, and publishes that rate with its [`stream_window`];
/// rank 0 takes the slowest rate and the smallest window, asks `streams_for(rate, window)`
/// how many streams that needs, and publishes both under `prefix`. Costs a few ms and two
/// store round trips per group, only when it spans hosts (`spans_hosts`, which every rank
/// must pass alike); `socks` needs only the ring's links.
///
/// [`Mesh`]: super::Mesh
#[allow(clippy::too_many_arguments)]
pub fn agree_links(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    socks: &[Option<TcpStream>],
    spans_hosts: bool,
    deadline: Instant,
    streams_for: &dyn Fn(Option<u64>, u64) -> Result<usize>,
) -> Result<LinkAgreement> {
    // Every rank answers the same (from the addresses all published), so all skip or none.
    if !spans_hosts {
        return Ok(LinkAgreement {
            bandwidth: None,
            streams: 1,
        });
    }
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let cross = |p: usize| socks[p].as_ref().filter(|s| between_hosts(s));
    let rate = probe((cross(next), next), (cross(prev), prev), deadline)?;
    let rate_text = |r: Option<u64>| r.map_or_else(|| "-".to_string(), |r| r.to_string());
    let key = |r: usize| format!("{prefix}/link_bandwidth/{r}");
    let agreed = format!("{prefix}/link_bandwidth");
    let text = if rank == 0 {
        let (mut slowest, mut window) = (rate, stream_window());
        let keys: Vec<String> = (1..size).map(key).collect();
        for raw in store.multi_get(&keys, remaining(deadline))? {
            let raw = String::from_utf8_lossy(&raw);
            let mut fields = raw.split(' ');
            if let Some(Ok(r)) = fields.next().map(str::parse::<u64>) {
                slowest = Some(slowest.map_or(r, |s| s.min(r)));
            }
            if let Some(Ok(w)) = fields.next().map(str::parse::<u64>) {
                window = window.min(w);
            }
        }
        let text = format!("{} {}", rate_text(slowest), streams_for(slowest, window)?);
        store.set(&agreed, text.as_bytes())?;
        text
    } else {
        let mine = format!("{} {}", rate_text(rate), stream_window());
        store.set(&key(rank), mine.as_bytes())?;
        String::from_utf8_lossy(&store.get(&agreed, remaining(deadline))?).into_owned()
    };
    let (bandwidth, streams) = text.split_once(' ').unwrap_or((&text, "1"));
    Ok(LinkAgreement {
        bandwidth: bandwidth.parse().ok(),
        streams: streams.parse().unwrap_or(1).max(1),
    })
}

/// Streams [`PROBE_BYTES`] into `to` (rank `next`'s socket) while reading as many from
/// `from` (rank `prev`'s; either may be absent, or both the same socket); returns the rate
/// `from` delivered at, from its first byte to its last.
fn probe(
    (to, next): (Option<&TcpStream>, usize),
    (from, prev): (Option<&TcpStream>, usize),
    deadline: Instant,
) -> Result<Option<u64>> {
    const CHUNK: usize = 64 << 10;
    let zeros = vec![0u8; CHUNK];
    let mut buf = vec![0u8; CHUNK];
    let (mut sent, mut got) = (0, 0);
    let mut timed: Option<(Instant, usize)> = None;
    let mut elapsed = None;
    let failed = |what: String, e: io::Error| {
        Error::network(format!(
            "measuring the links between hosts: {what} failed: {e}"
        ))
    };
    loop {
        let (sending, reading) = (
            to.filter(|_| sent < PROBE_BYTES),
            from.filter(|_| got < PROBE_BYTES),
        );
        if sending.is_none() && reading.is_none() {
            break;
        }
        let left = remaining(deadline).ok_or_else(|| {
            Error::network(format!(
                "timed out measuring the links between hosts (sent {sent} of {PROBE_BYTES} \
                 bytes, received {got} from rank {prev})"
            ))
        })?;
        let mut fds: Vec<libc::pollfd> = sending
            .map(|s| pollfd(s.as_raw_fd(), libc::POLLOUT))
            .into_iter()
            .chain(reading.map(|s| pollfd(s.as_raw_fd(), libc::POLLIN)))
            .collect();
        poll_fds(&mut fds, interrupt::slice(left));
        interrupt::check()?;
        if let Some(mut s) = sending {
            match s.write(&zeros[..(PROBE_BYTES - sent).min(CHUNK)]) {
                Ok(n) => sent += n,
                Err(e) if timed_out(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(failed(format!("sending to rank {next}"), e)),
            }
        }
        if let Some(mut s) = reading {
            match s.read(&mut buf[..(PROBE_BYTES - got).min(CHUNK)]) {
                Ok(0) => {
                    return Err(Error::network(format!(
                        "rank {prev} closed its connection while the link was measured"
                    )))
                }
                Ok(n) => {
                    got += n;
                    let (start, _) = *timed.get_or_insert((Instant::now(), n));
                    if got == PROBE_BYTES {
                        elapsed = Some(start.elapsed());
                    }
                }
                Err(e) if timed_out(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(failed(format!("receiving from rank {prev}"), e)),
            }
        }
    }
    Ok(match (timed, elapsed) {
        (Some((_, first)), Some(took)) if first < PROBE_BYTES && !took.is_zero() => {
            Some(((PROBE_BYTES - first) as f64 / took.as_secs_f64()) as u64)
        }
        _ => None,
    })
}
