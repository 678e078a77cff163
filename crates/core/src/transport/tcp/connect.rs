//! The connecting side and the mesh as a whole: publishing this rank's address, dialling the
//! lower ranks (with retries and the connecting side's handshake), accepting the higher ones
//! through the acceptor, and the extra streams to peers on other hosts ([`connect_streams`]).
//! The top of the module: it uses the others, and only `mod.rs` uses it.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::acceptor::{accept_peers, Accepting, Acceptor, Slots};
use super::handshake::{Hello, Reply, Status, ACCEPTOR_LABEL, CONNECTOR_LABEL, REPLY_LEN};
use super::interface::listen_ip;
use super::socket::{between_hosts, configure};
use crate::auth::{self, AuthKey, NONCE_LEN};
use crate::error::{Error, Result};
use crate::interrupt;
use crate::netio::{listen_on, timed_out, DeadlineIo};
use crate::store::Store;
use crate::timeout::remaining;
use crate::tls::{broken_token, Tls};

// ---------------------------------------------------------------------------------------------
// The connecting side

/// Connection errors a dialler retries: the peer not listening yet, its backlog full, or this
/// machine out of ephemeral ports for the moment, all of which pass at large worlds.
fn transient(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | TimedOut
            | WouldBlock
            | AddrNotAvailable
            | Interrupted
    )
}

/// A pause of `base` stretched by a random factor in [0.5, 1.5), so that ranks refused at
/// the same instant do not all come back at the same instant.
fn jittered(base: Duration) -> Duration {
    let mut b = [0u8; 2];
    let r = getrandom::getrandom(&mut b).map_or(0x8000, |_| u16::from_le_bytes(b));
    base.mul_f64(0.5 + f64::from(r) / 65536.0)
}

/// How a dial may end early: `Refused` says whether a refused connection is final (the peer
/// listened once, so it has exited) rather than a peer not listening yet; `stop` ends the
/// dial (checked between attempts and while waiting for the handshake).
#[derive(Clone, Copy)]
pub(super) struct DialEnd<'a> {
    pub(super) refused_is_final: bool,
    pub(super) stop: Option<&'a dyn Fn() -> bool>,
}

/// At connect: peers may not listen yet, and nothing stops a dial but its deadline.
const AT_CONNECT: DialEnd<'static> = DialEnd {
    refused_is_final: false,
    stop: None,
};

/// Dials `addr` until it answers or `deadline` passes, backing off (with jitter, up to
/// `MAX_BACKOFF`) while the refusal is one that passes. The error names the peer and the
/// last cause.
fn connect_with_retry(
    addr: SocketAddr,
    deadline: Instant,
    peer: usize,
    end: DialEnd<'_>,
) -> Result<TcpStream> {
    const MAX_BACKOFF: Duration = Duration::from_millis(500);
    let mut backoff = Duration::from_millis(1);
    let mut last: Option<io::Error> = None;
    loop {
        let Some(left) = remaining(deadline) else {
            let why = last.map_or_else(|| "no time left".into(), |e| e.to_string());
            return Err(Error::network(format!(
                "timed out connecting to rank {peer} at {addr} (last attempt: {why})"
            )));
        };
        if end.stop.is_some_and(|stop| stop()) {
            return Err(Error::network(format!(
                "stopped connecting to rank {peer} at {addr}"
            )));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if end.refused_is_final && e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(Error::network(format!(
                    "rank {peer} refused a connection at {addr}: it has exited or destroyed \
                     its process group"
                )))
            }
            Err(e) if transient(&e) => {
                interrupt::sleep(jittered(backoff).min(left))?;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                last = Some(e);
            }
            Err(e) => {
                return Err(Error::network(format!(
                    "cannot connect to rank {peer} at {addr}: {e}"
                )))
            }
        }
    }
}

/// The connecting side's handshake with rank `peer` at `addr`: hello, reply, and with a key the
/// proofs both ways. Returns the round trip from hello to reply (a latency sample), or the
/// status `peer` refused with. Errors say why the handshake broke (or `peer` failed to prove
/// itself).
fn greet(
    sock: &mut TcpStream,
    hello: &Hello,
    key: Option<&AuthKey>,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
    stop: Option<&dyn Fn() -> bool>,
) -> Result<std::result::Result<Duration, Status>> {
    let me = hello.rank;
    let fail = |why: &str| {
        Error::network(format!(
            "rank {me} cannot connect to rank {peer} at {addr}: {why}"
        ))
    };
    let hello_bytes = hello.encode();
    let mut io = DeadlineIo::new(sock, deadline);
    io.stop = stop;
    let read_reply = |io: &mut DeadlineIo<'_>| -> Result<Reply> {
        let mut b = [0u8; REPLY_LEN];
        match io.read_exact(&mut b) {
            Ok(()) => Reply::decode(&b).ok_or_else(|| fail("it answered with something else")),
            Err(_) if io.interrupted => Err(Error::Interrupted),
            Err(e) if timed_out(&e) => Err(fail("no answer to the handshake in time")),
            Err(_) => Err(fail(
                "it closed the connection during the handshake (another job, or a different \
                 RUSTDIST_AUTH_KEY?)",
            )),
        }
    };
    let sent = |r: io::Result<()>| r.map_err(|e| fail(&format!("cannot send the handshake: {e}")));
    let start = Instant::now();
    sent(io.write_all(&hello_bytes))?;
    let reply = read_reply(&mut io)?;
    let round_trip = start.elapsed();
    match (reply.status, key) {
        (Status::Ok, None) => Ok(Ok(round_trip)),
        (Status::Challenge, Some(key)) => {
            let theirs_ok = key.verify(ACCEPTOR_LABEL, &[&hello_bytes, &reply.nonce], &reply.tag);
            // Our proof goes out even when theirs failed, so that they log the refusal too.
            let proof = key.tag(CONNECTOR_LABEL, &[&hello_bytes, &reply.nonce]);
            sent(io.write_all(&proof))?;
            if !theirs_ok {
                return Err(fail(Status::AuthFailed.refusal()));
            }
            match read_reply(&mut io)?.status {
                Status::Ok => Ok(Ok(round_trip)),
                other => Ok(Err(other)),
            }
        }
        (other, _) => Ok(Err(other)),
    }
}

/// The error of a dial `peer` refused with `status`.
pub(super) fn refused(me: u64, peer: usize, addr: SocketAddr, status: Status) -> Error {
    Error::network(format!(
        "rank {me} cannot connect to rank {peer} at {addr}: {}",
        status.refusal()
    ))
}

/// What a rank publishes under `{prefix}/addr/{rank}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its listening address.
    pub addr: SocketAddr,
    /// The job id rank 0 drew.
    pub job: u64,
    /// Its TLS settings ([`Tls::token`]; empty with TLS off).
    pub tls: String,
}

impl Entry {
    fn text(&self) -> String {
        let (addr, job, tls) = (self.addr, self.job, &self.tls);
        match tls.is_empty() {
            true => format!("{addr} {job:016x}"),
            false => format!("{addr} {job:016x} {tls}"),
        }
    }
}

/// Parses what rank `peer` published.
fn parse_entry(peer: usize, raw: &[u8]) -> Result<Entry> {
    let text = String::from_utf8_lossy(raw);
    let mut fields = text.split(' ');
    let parsed = (|| {
        let addr = fields.next()?.parse().ok()?;
        let job = u64::from_str_radix(fields.next()?, 16).ok()?;
        let tls = fields.next().unwrap_or_default().to_string();
        Some(Entry { addr, job, tls })
    })();
    parsed.ok_or_else(|| Error::network(format!("rank {peer} published a bad address {text:?}")))
}

/// The entries ranks `peers` published, in one store request (a rank's bootstrap costs the
/// store O(1) requests, not one per peer).
pub fn peer_entries(
    store: &dyn Store,
    prefix: &str,
    peers: &[usize],
    deadline: Instant,
) -> Result<Vec<Entry>> {
    if peers.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<String> = peers.iter().map(|p| format!("{prefix}/addr/{p}")).collect();
    let raw = store.multi_get(&keys, remaining(deadline))?;
    peers
        .iter()
        .zip(&raw)
        .map(|(&p, r)| parse_entry(p, r))
        .collect()
}

/// A connected mesh: a socket to every peer, and what the heartbeat needs.
pub struct Mesh {
    /// Non-blocking, TCP_NODELAY, indexed by rank (`None` for this rank).
    pub socks: Vec<Option<TcpStream>>,
    /// The job id rank 0 drew.
    pub job: u64,
    /// A UDP socket on this rank's listening address (`None` alone in the group).
    pub udp: Option<UdpSocket>,
    /// The listening address of every peer (where its UDP socket is, too).
    pub addrs: Vec<Option<SocketAddr>>,
    /// Every rank's TLS settings as it published them (this rank's too; [`Entry::tls`]).
    pub tls: Vec<String>,
    /// The shortest handshake round trip this rank saw connecting to the lower ranks.
    pub round_trip: Option<Duration>,
    /// Where the higher ranks connect, kept for their extra streams ([`connect_streams`]).
    listener: Option<TcpListener>,
    /// Links on demand that peers made while this rank was connecting (see `Slots::early`).
    pub early: Vec<Option<Vec<TcpStream>>>,
    /// Handshakes in progress on `listener` when connecting was done with it.
    accepting: Accepting,
}

impl Mesh {
    /// The listener, for links made later ([`super::OnDemand`]), with its handshakes in
    /// progress; None alone in the group.
    pub(super) fn take_listener(&mut self) -> Option<(TcpListener, Accepting)> {
        let accepting = std::mem::take(&mut self.accepting);
        self.listener.take().map(|l| (l, accepting))
    }

    /// Whether the group spans hosts: some peer listens on another address than this rank
    /// (every rank answers the same).
    pub fn spans_hosts(&self) -> bool {
        let own = self.listener.as_ref().and_then(|l| l.local_addr().ok());
        own.is_some_and(|own| self.addrs.iter().flatten().any(|a| a.ip() != own.ip()))
    }
}

/// A TCP listener on `ip` and a UDP socket with the same port number.
fn bind_pair(ip: IpAddr) -> Result<(TcpListener, UdpSocket, SocketAddr)> {
    let mut last = None;
    // The TCP port is free for TCP only: retry while its UDP twin is taken.
    for _ in 0..16 {
        let listener = listen_on(SocketAddr::new(ip, 0))
            .map_err(|e| Error::network(format!("cannot listen on {ip}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::network(format!("cannot read listening address: {e}")))?;
        match UdpSocket::bind(addr) {
            Ok(udp) => return Ok((listener, udp, addr)),
            Err(e) => last = Some(e),
        }
    }
    Err(Error::network(format!(
        "cannot bind a UDP socket beside the listener on {ip}: {}",
        last.map_or_else(String::new, |e| e.to_string())
    )))
}

/// Connects this rank to the peers of the group that `now` names (every one: a full mesh; the
/// rest are left to links on demand, [`super::OnDemand`]): publishes its listening address
/// under `{prefix}/addr/{rank}`, dials the lower ranks named and accepts the higher ones, all
/// before `deadline`, authenticating with `key` when given and publishing the settings of
/// `tls` with its address (links are encrypted later, by the mesh), or why this rank cannot
/// use its settings, so that every rank fails saying so ([`crate::tls::agree`]). Every rank must pass a symmetric
/// `now` (p names q exactly when q names p). Every peer's address is learnt either way, in
/// two store requests.
#[allow(clippy::too_many_arguments)]
pub fn connect_mesh_with(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    group: u32,
    deadline: Instant,
    key: Option<&AuthKey>,
    tls: std::result::Result<Option<&Tls>, &Error>,
    now: &dyn Fn(usize) -> bool,
) -> Result<Mesh> {
    let mut socks: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    let mut addrs = vec![None; size];
    let entry_key = |r: usize| format!("{prefix}/addr/{r}");
    let mut tokens = vec![String::new(); size];
    if let Some(own) = tokens.get_mut(rank) {
        *own = match tls {
            Ok(Some(tls)) => tls.token(key, &entry_key(rank)),
            Ok(None) => String::new(),
            Err(why) => broken_token(why),
        };
    }
    if size <= 1 {
        return Ok(Mesh {
            socks,
            job: 0,
            udp: None,
            addrs,
            tls: tokens,
            round_trip: None,
            listener: None,
            early: Vec::new(),
            accepting: Accepting::default(),
        });
    }
    let size32 = u32::try_from(size).map_err(|_| Error::invalid("world size exceeds u32"))?;
    let (listener, udp, addr) = bind_pair(listen_ip()?)?;
    // Rank 0 draws the job id; the others learn it with rank 0's address.
    let first = match rank {
        0 => None,
        _ => Some(peer_entries(store, prefix, &[0], deadline)?.remove(0)),
    };
    let job = match &first {
        Some(entry) => entry.job,
        None => {
            let n = auth::nonce()?;
            u64::from_le_bytes([n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]])
        }
    };
    let own = Entry {
        addr,
        job,
        tls: tokens[rank].clone(),
    };
    store.set(&entry_key(rank), own.text().as_bytes())?;
    let mut shortest_round_trip: Option<Duration> = None;
    let others: Vec<usize> = (1..rank).collect();
    let entries = first
        .into_iter()
        .chain(peer_entries(store, prefix, &others, deadline)?);
    for (peer, entry) in entries.enumerate() {
        check_job(prefix, peer, entry.job, job)?;
        addrs[peer] = Some(entry.addr);
        tokens[peer] = entry.tls;
        if !now(peer) {
            continue;
        }
        let hello = Hello {
            job,
            group,
            size: size32,
            rank: rank as u64,
            stream: 0,
            auth: key.is_some(),
            nonce: [0; NONCE_LEN],
        };
        let (sock, round_trip) = dial(hello, key, peer, entry.addr, deadline)?;
        shortest_round_trip = Some(shortest_round_trip.map_or(round_trip, |s| s.min(round_trip)));
        socks[peer] = Some(sock);
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::network(format!("cannot configure listener: {e}")))?;
    let acceptor = Acceptor {
        rank,
        size,
        group,
        job,
        key,
    };
    let mut slots = Slots {
        socks: (0..size)
            .map(|p| {
                if p > rank && now(p) {
                    vec![None]
                } else {
                    Vec::new()
                }
            })
            .collect(),
        first_stream: 0,
        early: (0..size)
            .map(|p| (p != rank && !now(p)).then(Vec::new))
            .collect(),
    };
    let mut accepting = Accepting::default();
    accept_peers(&listener, &mut accepting, &acceptor, &mut slots, deadline)?;
    let early = slots.early;
    for (slot, mut accepted) in socks.iter_mut().zip(slots.socks).skip(rank + 1) {
        if let Some(sock) = accepted.pop().flatten() {
            *slot = Some(sock);
        }
    }
    // The higher ranks have all published now (those linked dialled this one): one request
    // completes the addresses, for heartbeats and links on demand.
    let higher: Vec<usize> = (rank + 1..size).collect();
    for (peer, entry) in higher
        .iter()
        .copied()
        .zip(peer_entries(store, prefix, &higher, deadline)?)
    {
        check_job(prefix, peer, entry.job, job)?;
        addrs[peer] = Some(entry.addr);
        tokens[peer] = entry.tls;
    }
    Ok(Mesh {
        socks,
        job,
        udp: Some(udp),
        addrs,
        tls: tokens,
        round_trip: shortest_round_trip,
        listener: Some(listener),
        early,
        accepting,
    })
}

/// Fails when rank `peer` published an address of another job than rank 0's `job`.
fn check_job(prefix: &str, peer: usize, peer_job: u64, job: u64) -> Result<()> {
    if peer_job == job {
        return Ok(());
    }
    Err(Error::network(format!(
        "rank {peer} published an address of another job under {prefix:?} (job \
         {peer_job:#x}, rank 0's is {job:#x}): stale keys in the store?"
    )))
}

/// How a dial ended: admitted (the configured socket and the handshake's round trip), or
/// refused with a status.
pub(super) enum Dialled {
    Admitted(TcpStream, Duration),
    Refused(Status),
}

/// Connects to `peer` at `addr` as `hello` says (with a fresh nonce when keyed) and, when
/// admitted, configures the socket.
pub(super) fn dial_once(
    mut hello: Hello,
    key: Option<&AuthKey>,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
    end: DialEnd<'_>,
) -> Result<Dialled> {
    if key.is_some() {
        hello.nonce = auth::nonce()?;
    }
    let mut sock = connect_with_retry(addr, deadline, peer, end)?;
    Ok(
        match greet(&mut sock, &hello, key, peer, addr, deadline, end.stop)? {
            Ok(round_trip) => {
                configure(&sock)?;
                Dialled::Admitted(sock, round_trip)
            }
            Err(status) => Dialled::Refused(status),
        },
    )
}

/// [`dial_once`], a refusal being an error.
fn dial(
    hello: Hello,
    key: Option<&AuthKey>,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<(TcpStream, Duration)> {
    match dial_once(hello, key, peer, addr, deadline, AT_CONNECT)? {
        Dialled::Admitted(sock, round_trip) => Ok((sock, round_trip)),
        Dialled::Refused(status) => Err(refused(hello.rank, peer, addr, status)),
    }
}

/// Opens `streams - 1` more connections to every peer that `mesh` reaches across hosts
/// (lower ranks are dialled, higher ones accepted, as for the first), before `deadline`.
/// Returns them by peer (none for peers on this host, or with `streams` 1). Every rank must
/// pass the same `streams`.
pub fn connect_streams(
    mesh: &mut Mesh,
    rank: usize,
    group: u32,
    streams: usize,
    deadline: Instant,
    key: Option<&AuthKey>,
) -> Result<Vec<Vec<TcpStream>>> {
    let size = mesh.socks.len();
    let mut extra: Vec<Vec<TcpStream>> = (0..size).map(|_| Vec::new()).collect();
    let cross = |p: usize| mesh.socks[p].as_ref().is_some_and(between_hosts);
    let Some(listener) = mesh.listener.as_ref().filter(|_| streams > 1) else {
        return Ok(extra);
    };
    let size32 = u32::try_from(size).map_err(|_| Error::invalid("world size exceeds u32"))?;
    for peer in (0..rank).filter(|&p| cross(p)) {
        let addr = mesh.addrs[peer].ok_or_else(|| {
            Error::backend(format!("rank {peer}'s address is unknown to rank {rank}"))
        })?;
        for stream in 1..streams {
            let hello = Hello {
                job: mesh.job,
                group,
                size: size32,
                rank: rank as u64,
                stream: stream as u32,
                auth: key.is_some(),
                nonce: [0; NONCE_LEN],
            };
            extra[peer].push(dial(hello, key, peer, addr, deadline)?.0);
        }
    }
    let acceptor = Acceptor {
        rank,
        size,
        group,
        job: mesh.job,
        key,
    };
    let mut slots = Slots {
        socks: (0..size)
            .map(|p| {
                let n = if p > rank && cross(p) { streams } else { 0 };
                (0..n).map(|_| None).collect()
            })
            .collect(),
        first_stream: 1,
        early: std::mem::take(&mut mesh.early),
    };
    let accepted = accept_peers(
        listener,
        &mut mesh.accepting,
        &acceptor,
        &mut slots,
        deadline,
    );
    mesh.early = slots.early;
    accepted?;
    for (peer, accepted) in slots.socks.into_iter().enumerate() {
        extra[peer].extend(accepted.into_iter().flatten());
    }
    Ok(extra)
}
