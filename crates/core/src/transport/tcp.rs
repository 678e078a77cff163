//! TCP connection setup: every rank listens on its chosen interface, publishes its address in
//! the store, connects to the lower ranks and accepts the higher ones.
//!
//! Each connection opens with a handshake. The connecting rank sends a fixed-size hello naming
//! the job (a random id rank 0 draws and publishes with its address, so two jobs never
//! cross-connect), the group, the world size and its rank; the accepting rank answers with a
//! status. With `RUSTDIST_AUTH_KEY` set, both sides prove they hold the key (HMAC over a fresh
//! challenge, see [`crate::auth`]) before the connection counts. Every handshake message has a
//! fixed size and is read into a fixed buffer, so a hostile connection is dropped (and logged)
//! before its bytes can decide any allocation; incoming handshakes progress concurrently, so a
//! silent connection cannot hold up the real peers.
//!
//! Where one stream cannot fill a link between hosts, more streams to the same peer follow once
//! the links are measured ([`connect_streams`]): the same handshake, its hello naming which
//! stream it is, and a stream nobody expects is refused like a wrong rank.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use socket2::SockRef;

use crate::auth::{self, AuthKey, Nonce, Tag, NONCE_LEN, TAG_LEN};
use crate::error::{Error, Result};
use crate::interrupt;
use crate::netio::{timed_out, DeadlineIo};
use crate::store::Store;
use crate::transport::remaining;

/// The variables naming the interface to use, in order of precedence.
pub const IFNAME_VARS: [&str; 2] = ["RUSTDIST_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"];

const HELLO_MAGIC: u32 = 0x5244_4832; // "RDH2"
const VERSION: u16 = 2;
/// The hello: magic, version, flags, job, group, size, rank, the connecting side's nonce.
pub const HELLO_LEN: usize = 36 + NONCE_LEN;
/// A reply: magic, status, the accepting side's nonce and proof (zero when unused).
pub const REPLY_LEN: usize = 8 + NONCE_LEN + TAG_LEN;
/// Hello flag: the connecting side holds an auth key.
const FLAG_AUTH: u16 = 1;
const CONNECTOR_LABEL: &[u8] = b"rustdist peer connector v1";
const ACCEPTOR_LABEL: &[u8] = b"rustdist peer acceptor v1";
/// Incoming connections in mid-handshake at once; beyond that the oldest is dropped, so a
/// flood can neither grow memory nor lock the real peers out for long.
const MAX_PENDING: usize = 64;
/// How long an incoming connection may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Choosing the interface

/// One IPv4 address of a network interface that is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub ip: Ipv4Addr,
}

/// The IPv4 addresses of the interfaces that are up, in the system's order.
pub fn interfaces() -> Result<Vec<Interface>> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return Err(Error::network(format!(
            "cannot list network interfaces: {}",
            io::Error::last_os_error()
        )));
    }
    let mut found = Vec::new();
    let mut cur = addrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned, alive until freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as libc::c_uint == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null; the family says which sockaddr it is.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        found.push(Interface {
            name: name.to_string_lossy().into_owned(),
            ip: Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        });
    }
    // SAFETY: `addrs` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(addrs) };
    Ok(found)
}

/// Picks the interface `spec` names, in NCCL_SOCKET_IFNAME's syntax: a comma-separated list of
/// name prefixes (`eth` matches eth0 and eth1), all exact names with a leading `=`, and an
/// exclusion list with a leading `^` (`^docker,lo`, `^=eth0`). With a list, its first entry
/// that matches an interface wins; with an exclusion list, the first interface in the system's
/// order that no entry matches, loopback only when nothing else is left. `var` names the
/// variable for the error, which lists the interfaces there are.
pub fn select_interface(var: &str, spec: &str, available: &[Interface]) -> Result<Interface> {
    let (exclude, rest) = match spec.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec.trim()),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let entries: Vec<&str> = rest
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let matches = |entry: &str, name: &str| {
        if exact {
            name == entry
        } else {
            name.starts_with(entry)
        }
    };
    let chosen = if exclude {
        let kept = || {
            available
                .iter()
                .filter(|i| !entries.iter().any(|e| matches(e, &i.name)))
        };
        kept()
            .find(|i| !i.ip.is_loopback())
            .or_else(|| kept().next())
    } else {
        entries
            .iter()
            .find_map(|e| available.iter().find(|i| matches(e, &i.name)))
    };
    chosen.cloned().ok_or_else(|| {
        let listed: Vec<String> = available
            .iter()
            .map(|i| format!("{} ({})", i.name, i.ip))
            .collect();
        Error::invalid(format!(
            "{var}={spec:?} matches no network interface that is up with an IPv4 address; \
             available: {}",
            if listed.is_empty() {
                "none".to_owned()
            } else {
                listed.join(", ")
            }
        ))
    })
}

/// The address to listen on: the interface `RUSTDIST_SOCKET_IFNAME` / `GLOO_SOCKET_IFNAME`
/// selects when set, else the local address that routes to MASTER_ADDR, else loopback.
fn listen_ip() -> Result<IpAddr> {
    for var in IFNAME_VARS {
        if let Some(spec) = std::env::var(var).ok().filter(|s| !s.trim().is_empty()) {
            return select_interface(var, &spec, &interfaces()?).map(|i| IpAddr::V4(i.ip));
        }
    }
    let master = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let target = format!("{master}:9");
    let probe = UdpSocket::bind(("0.0.0.0", 0))
        .and_then(|s| s.connect(target.as_str()).map(|_| s))
        .and_then(|s| s.local_addr());
    Ok(probe
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

// ---------------------------------------------------------------------------------------------
// Handshake messages

/// What a connecting rank says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The rendezvous' random id (drawn by rank 0).
    pub job: u64,
    /// The group's id (a hash of its name).
    pub group: u32,
    pub size: u32,
    pub rank: u64,
    /// Which of the streams between the two ranks this connection is (0: the first; more
    /// follow on links that one stream cannot fill).
    pub stream: u32,
    /// The connecting side holds an auth key; `nonce` is its challenge.
    pub auth: bool,
    pub nonce: Nonce,
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if self.auth { FLAG_AUTH } else { 0 };
        b[6..8].copy_from_slice(&flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.job.to_le_bytes());
        b[16..20].copy_from_slice(&self.group.to_le_bytes());
        b[20..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.rank.to_le_bytes());
        b[32..36].copy_from_slice(&self.stream.to_le_bytes());
        b[36..].copy_from_slice(&self.nonce);
        b
    }

    /// The hello in `b`; `None` when it is not one (wrong magic or version).
    pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        if u32_at(b, 0) != HELLO_MAGIC || u16_at(b, 4) != VERSION {
            return None;
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[36..]);
        Some(Hello {
            job: u64_at(b, 8),
            group: u32_at(b, 16),
            size: u32_at(b, 20),
            rank: u64_at(b, 24),
            stream: u32_at(b, 32),
            auth: u16_at(b, 6) & FLAG_AUTH != 0,
            nonce,
        })
    }
}

/// The accepting side's answer to a hello (and, with a key, to the proof).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Connected.
    Ok,
    /// Prove you hold the key (the reply carries the challenge and the acceptor's proof).
    Challenge,
    WrongJob,
    WrongGroup,
    WrongSize,
    BadRank,
    Duplicate,
    AuthRequired,
    AuthUnexpected,
    AuthFailed,
}

const STATUSES: [Status; 10] = [
    Status::Ok,
    Status::Challenge,
    Status::WrongJob,
    Status::WrongGroup,
    Status::WrongSize,
    Status::BadRank,
    Status::Duplicate,
    Status::AuthRequired,
    Status::AuthUnexpected,
    Status::AuthFailed,
];

impl Status {
    fn code(self) -> u32 {
        STATUSES.iter().position(|&s| s == self).unwrap_or(0) as u32
    }

    /// Why a connection was refused, from the connecting side's point of view.
    fn refusal(self) -> &'static str {
        match self {
            Status::Ok | Status::Challenge => {
                "authentication failed: it did not follow the RUSTDIST_AUTH_KEY exchange"
            }
            Status::WrongJob => {
                "it belongs to another job (the store holds an address of an earlier run?)"
            }
            Status::WrongGroup => "it is not in this process group",
            Status::WrongSize => "it has a different world size",
            Status::BadRank => "it does not expect a connection from this rank",
            Status::Duplicate => {
                "it is already connected to this rank (two processes with the same rank?)"
            }
            Status::AuthRequired => {
                "authentication failed: it requires RUSTDIST_AUTH_KEY, which is not set here"
            }
            Status::AuthUnexpected => {
                "authentication failed: RUSTDIST_AUTH_KEY is set here but not there"
            }
            Status::AuthFailed => {
                "authentication failed: its RUSTDIST_AUTH_KEY differs from this rank's"
            }
        }
    }
}

/// One reply of the accepting side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub status: Status,
    pub nonce: Nonce,
    pub tag: Tag,
}

impl Reply {
    fn plain(status: Status) -> Reply {
        Reply {
            status,
            nonce: [0; NONCE_LEN],
            tag: [0; TAG_LEN],
        }
    }

    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.status.code().to_le_bytes());
        b[8..8 + NONCE_LEN].copy_from_slice(&self.nonce);
        b[8 + NONCE_LEN..].copy_from_slice(&self.tag);
        b
    }

    /// The reply in `b`; `None` when it is not one.
    pub fn decode(b: &[u8; REPLY_LEN]) -> Option<Reply> {
        if u32_at(b, 0) != HELLO_MAGIC {
            return None;
        }
        let status = *STATUSES.get(usize::try_from(u32_at(b, 4)).ok()?)?;
        let mut reply = Reply::plain(status);
        reply.nonce.copy_from_slice(&b[8..8 + NONCE_LEN]);
        reply.tag.copy_from_slice(&b[8 + NONCE_LEN..]);
        Some(reply)
    }
}

// ---------------------------------------------------------------------------------------------
// The connecting side

fn connect_with_retry(addr: SocketAddr, deadline: Instant, peer: usize) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(1);
    loop {
        let left = remaining(deadline).ok_or_else(|| {
            Error::network(format!("timed out connecting to rank {peer} at {addr}"))
        })?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                interrupt::sleep(backoff.min(left))?;
                backoff = (backoff * 2).min(Duration::from_millis(100));
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
/// proofs both ways. Returns the round trip from hello to reply (a latency sample). Errors say
/// why `peer` refused (or failed to prove itself).
fn greet(
    sock: &mut TcpStream,
    hello: &Hello,
    key: Option<&AuthKey>,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<Duration> {
    let me = hello.rank;
    let fail = |why: &str| {
        Error::network(format!(
            "rank {me} cannot connect to rank {peer} at {addr}: {why}"
        ))
    };
    let hello_bytes = hello.encode();
    let mut io = DeadlineIo::new(sock, deadline);
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
        (Status::Ok, None) => Ok(round_trip),
        (Status::Challenge, Some(key)) => {
            let theirs_ok = key.verify(ACCEPTOR_LABEL, &[&hello_bytes, &reply.nonce], &reply.tag);
            // Our proof goes out even when theirs failed, so that they log the refusal too.
            let proof = key.tag(CONNECTOR_LABEL, &[&hello_bytes, &reply.nonce]);
            sent(io.write_all(&proof))?;
            if !theirs_ok {
                return Err(fail(Status::AuthFailed.refusal()));
            }
            match read_reply(&mut io)?.status {
                Status::Ok => Ok(round_trip),
                other => Err(fail(other.refusal())),
            }
        }
        (other, _) => Err(fail(other.refusal())),
    }
}

// ---------------------------------------------------------------------------------------------
// The accepting side

/// An incoming connection in mid-handshake.
struct Incoming {
    sock: TcpStream,
    from: SocketAddr,
    since: Instant,
    /// The message being read: the hello, then (with a key) the proof in its first bytes.
    buf: [u8; HELLO_LEN],
    got: usize,
    /// After a challenge went out: the hello's bytes, the rank and stream it claims and our
    /// nonce.
    challenged: Option<([u8; HELLO_LEN], Slot, Nonce)>,
}

/// A connection's place: the peer's rank and which of its streams it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    peer: usize,
    stream: usize,
}

/// The connections an accepting rank expects, by peer and stream: `slots[peer][stream]`, filled
/// as they come. A peer's first `first_stream` entries are not expected here (rank 0 of a
/// peer's streams is its first connection, made before the extra ones).
struct Slots {
    socks: Vec<Vec<Option<TcpStream>>>,
    first_stream: usize,
}

impl Slots {
    fn expects(&self, peer: usize, stream: usize) -> bool {
        stream >= self.first_stream && self.socks.get(peer).is_some_and(|s| stream < s.len())
    }

    fn taken(&self, slot: Slot) -> bool {
        self.socks[slot.peer][slot.stream].is_some()
    }

    /// Expected connections that have not come yet, by peer.
    fn missing(&self) -> impl Iterator<Item = Slot> + '_ {
        self.socks
            .iter()
            .enumerate()
            .flat_map(move |(peer, streams)| {
                streams
                    .iter()
                    .enumerate()
                    .skip(self.first_stream)
                    .filter(|(_, s)| s.is_none())
                    .map(move |(stream, _)| Slot { peer, stream })
            })
    }
}

/// What one step of an incoming handshake came to.
enum Step {
    Pending,
    /// Connected in this slot.
    Done(Slot),
    /// Refused or broken: the reason, for the log.
    Dropped(String),
}

/// The accepting rank's view of the group, against which hellos are checked.
struct Acceptor<'a> {
    rank: usize,
    size: usize,
    group: u32,
    job: u64,
    key: Option<&'a AuthKey>,
}

impl Acceptor<'_> {
    /// Reads what `inc` sent and moves its handshake on. `slots` tells who is connected.
    fn step(&self, inc: &mut Incoming, slots: &Slots) -> Step {
        let want = if inc.challenged.is_some() {
            TAG_LEN
        } else {
            HELLO_LEN
        };
        while inc.got < want {
            match inc.sock.read(&mut inc.buf[inc.got..want]) {
                Ok(0) => return Step::Dropped("it hung up during the handshake".into()),
                Ok(n) => inc.got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Pending,
                Err(e) => return Step::Dropped(format!("read failed: {e}")),
            }
        }
        inc.got = 0;
        match inc.challenged {
            None => self.on_hello(inc, slots),
            Some((hello, slot, nonce)) => {
                let proof = &inc.buf[..TAG_LEN];
                let key_ok = self
                    .key
                    .is_some_and(|k| k.verify(CONNECTOR_LABEL, &[&hello, &nonce], proof));
                if !key_ok {
                    return refuse(
                        inc,
                        Status::AuthFailed,
                        format!("authentication failed: rank {}'s proof does not match this rank's RUSTDIST_AUTH_KEY", slot.peer),
                    );
                }
                self.admit(inc, slot, slots)
            }
        }
    }

    /// What in `hello` disagrees with this rank's view of the group, if anything.
    fn mismatch(&self, hello: &Hello, slots: &Slots) -> Option<(Status, String)> {
        let (rank, size) = (self.rank as u64, self.size as u64);
        Some(if hello.job != self.job {
            let want = self.job;
            (
                Status::WrongJob,
                format!("another job ({:#x}, not {want:#x})", hello.job),
            )
        } else if hello.group != self.group {
            (
                Status::WrongGroup,
                format!("another group (id {:#x})", hello.group),
            )
        } else if u64::from(hello.size) != size {
            (
                Status::WrongSize,
                format!("world size {}, not {size}", hello.size),
            )
        } else if hello.rank <= rank || hello.rank >= size {
            let claimed = hello.rank;
            (
                Status::BadRank,
                format!("it claims rank {claimed}, which does not connect to rank {rank}"),
            )
        } else if !slots.expects(hello.rank as usize, hello.stream as usize) {
            let (claimed, stream) = (hello.rank, hello.stream);
            (
                Status::BadRank,
                format!("rank {claimed} offers stream {stream}, which rank {rank} does not expect from it"),
            )
        } else {
            return None;
        })
    }

    fn on_hello(&self, inc: &mut Incoming, slots: &Slots) -> Step {
        let Some(hello) = Hello::decode(&inc.buf) else {
            return Step::Dropped("not a rustdist peer (wrong magic or version)".into());
        };
        if let Some((status, why)) = self.mismatch(&hello, slots) {
            return refuse(inc, status, why);
        }
        let slot = Slot {
            peer: hello.rank as usize,
            stream: hello.stream as usize,
        };
        let peer = slot.peer;
        match (self.key, hello.auth) {
            (None, false) => self.admit(inc, slot, slots),
            (None, true) => refuse(
                inc,
                Status::AuthUnexpected,
                format!("rank {peer} has RUSTDIST_AUTH_KEY set, this rank does not"),
            ),
            (Some(_), false) => refuse(
                inc,
                Status::AuthRequired,
                format!("authentication failed: rank {peer} did not authenticate (RUSTDIST_AUTH_KEY is set here)"),
            ),
            (Some(key), true) => {
                let nonce = match auth::nonce() {
                    Ok(n) => n,
                    Err(e) => return Step::Dropped(e.to_string()),
                };
                let tag = key.tag(ACCEPTOR_LABEL, &[&inc.buf, &nonce]);
                let reply = Reply {
                    status: Status::Challenge,
                    nonce,
                    tag,
                };
                if let Err(why) = answer(inc, &reply) {
                    return Step::Dropped(why);
                }
                inc.challenged = Some((inc.buf, slot, nonce));
                Step::Pending
            }
        }
    }

    /// Connects `slot` unless another connection already did.
    fn admit(&self, inc: &mut Incoming, slot: Slot, slots: &Slots) -> Step {
        if slots.taken(slot) {
            let Slot { peer, stream } = slot;
            return refuse(
                inc,
                Status::Duplicate,
                format!("a second connection claims rank {peer} (stream {stream}), which is already connected"),
            );
        }
        match answer(inc, &Reply::plain(Status::Ok)) {
            Ok(()) => Step::Done(slot),
            Err(why) => Step::Dropped(why),
        }
    }
}

/// Sends `reply` on the non-blocking socket. A fresh connection's send buffer always takes a
/// reply whole; one that does not is a broken peer.
fn answer(inc: &mut Incoming, reply: &Reply) -> std::result::Result<(), String> {
    let bytes = reply.encode();
    match inc.sock.write(&bytes) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(_) => Err("it does not take the handshake reply".into()),
        Err(e) => Err(format!("cannot answer: {e}")),
    }
}

/// Tells the connecting side why it is refused (best effort) and drops it.
fn refuse(inc: &mut Incoming, status: Status, why: String) -> Step {
    let _ = answer(inc, &Reply::plain(status));
    Step::Dropped(why)
}

/// Accepts the connections `slots` expects on `listener` until all are connected or
/// `deadline` passes.
fn accept_peers(
    listener: &TcpListener,
    acceptor: &Acceptor<'_>,
    slots: &mut Slots,
    deadline: Instant,
) -> Result<()> {
    let rank = acceptor.rank;
    let mut pending: Vec<Incoming> = Vec::with_capacity(MAX_PENDING);
    let mut missing = slots.missing().count();
    let drop_conn = |inc: Incoming, why: &str| {
        log::warn!("rank {rank}: dropped a connection from {}: {why}", inc.from);
    };
    while missing > 0 {
        loop {
            match listener.accept() {
                Ok((sock, from)) => {
                    if sock.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if pending.len() == MAX_PENDING {
                        drop_conn(pending.remove(0), "too many handshakes at once");
                    }
                    pending.push(Incoming {
                        sock,
                        from,
                        since: Instant::now(),
                        buf: [0; HELLO_LEN],
                        got: 0,
                        challenged: None,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of fds, a connection reset before accept: keep serving the others.
                Err(e) => {
                    log::warn!("rank {rank}: accept failed: {e}");
                    break;
                }
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let step = if pending[i].since.elapsed() > HANDSHAKE_TIMEOUT {
                Step::Dropped("it did not finish the handshake in time".into())
            } else {
                acceptor.step(&mut pending[i], slots)
            };
            match step {
                Step::Pending => i += 1,
                Step::Done(slot) => {
                    let inc = pending.swap_remove(i);
                    configure(&inc.sock)?;
                    slots.socks[slot.peer][slot.stream] = Some(inc.sock);
                    missing -= 1;
                }
                Step::Dropped(why) => drop_conn(pending.swap_remove(i), &why),
            }
        }
        if missing == 0 {
            break;
        }
        let left = remaining(deadline).ok_or_else(|| {
            let mut absent: Vec<String> = slots.missing().map(|s| s.peer.to_string()).collect();
            absent.dedup();
            Error::network(format!(
                "rank {rank} timed out waiting for ranks [{}] to connect",
                absent.join(", ")
            ))
        })?;
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(pending.iter().map(|p| p.sock.as_raw_fd()))
            .map(|fd| pollfd(fd, libc::POLLIN))
            .collect();
        poll_fds(
            &mut fds,
            interrupt::slice(left.min(Duration::from_millis(100))),
        );
        interrupt::check()?;
    }
    Ok(())
}

/// Send buffer of a connection between two ranks on one host (loopback). The kernel's own
/// reaches `tcp_wmem`'s 4 MiB, so a sender ran megabytes ahead of its reader and both copies
/// ran from memory; with this much the reader copies out bytes still in cache (1.4x-2x on
/// large messages, README's Intel TCP table). 32 KiB stalls the links. Links between hosts
/// keep the kernel's, which their bandwidth-delay product needs.
const HOST_LOCAL_SEND_BUFFER_BYTES: usize = 128 << 10;

fn configure(sock: &TcpStream) -> Result<()> {
    sock.set_nodelay(true)
        .and_then(|_| sock.set_nonblocking(true))
        .and_then(|_| {
            if between_hosts(sock) {
                return Ok(());
            }
            SockRef::from(sock).set_send_buffer_size(HOST_LOCAL_SEND_BUFFER_BYTES)
        })
        .map_err(|e| Error::network(format!("cannot configure socket: {e}")))
}

/// What a rank publishes under `{prefix}/addr/{rank}`: its listening address and the job id.
fn published(addr: SocketAddr, job: u64) -> String {
    format!("{addr} {job:016x}")
}

/// The address and job id rank `peer` published.
fn peer_entry(
    store: &dyn Store,
    prefix: &str,
    peer: usize,
    deadline: Instant,
) -> Result<(SocketAddr, u64)> {
    let raw = store.get(&format!("{prefix}/addr/{peer}"), remaining(deadline))?;
    let text = String::from_utf8_lossy(&raw);
    text.split_once(' ')
        .and_then(|(addr, job)| Some((addr.parse().ok()?, u64::from_str_radix(job, 16).ok()?)))
        .ok_or_else(|| Error::network(format!("rank {peer} published a bad address {text:?}")))
}

/// Connects this rank to every other rank of the group: publishes its listening address under
/// `{prefix}/addr/{rank}`, connects to every lower rank and accepts every higher one, all before
/// `deadline`, authenticating with `RUSTDIST_AUTH_KEY` when set.
pub fn connect_mesh(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    group: u32,
    deadline: Instant,
) -> Result<Mesh> {
    let key = AuthKey::from_env();
    connect_mesh_with(store, prefix, rank, size, group, deadline, key.as_ref())
}

/// A connected mesh: a socket to every peer, and what the heartbeat needs.
pub struct Mesh {
    /// Non-blocking, TCP_NODELAY, indexed by rank (`None` for this rank).
    pub socks: Vec<Option<TcpStream>>,
    /// The job id rank 0 drew.
    pub job: u64,
    /// A UDP socket on this rank's listening address (`None` alone in the group).
    pub udp: Option<UdpSocket>,
    /// The listening address of every lower rank (where its UDP socket is, too).
    pub lower: Vec<Option<SocketAddr>>,
    /// The shortest handshake round trip this rank saw connecting to the lower ranks.
    pub round_trip: Option<Duration>,
    /// Where the higher ranks connect, kept for their extra streams ([`connect_streams`]).
    listener: Option<TcpListener>,
}

/// A TCP listener on `ip` and a UDP socket with the same port number.
fn bind_pair(ip: IpAddr) -> Result<(TcpListener, UdpSocket, SocketAddr)> {
    let mut last = None;
    // The TCP port is free for TCP only: retry while its UDP twin is taken.
    for _ in 0..16 {
        let listener = TcpListener::bind((ip, 0))
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

/// [`connect_mesh`] with the auth key given (`None`: no authentication).
pub fn connect_mesh_with(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    group: u32,
    deadline: Instant,
    key: Option<&AuthKey>,
) -> Result<Mesh> {
    let mut socks: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    let mut lower = vec![None; size];
    if size <= 1 {
        return Ok(Mesh {
            socks,
            job: 0,
            udp: None,
            lower,
            round_trip: None,
            listener: None,
        });
    }
    let size32 = u32::try_from(size).map_err(|_| Error::invalid("world size exceeds u32"))?;
    let (listener, udp, addr) = bind_pair(listen_ip()?)?;
    // Rank 0 draws the job id; the others learn it with rank 0's address.
    let first = match rank {
        0 => None,
        _ => Some(peer_entry(store, prefix, 0, deadline)?),
    };
    let job = match first {
        Some((_, job)) => job,
        None => {
            let n = auth::nonce()?;
            u64::from_le_bytes([n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]])
        }
    };
    store.set(
        &format!("{prefix}/addr/{rank}"),
        published(addr, job).as_bytes(),
    )?;
    let mut shortest_round_trip: Option<Duration> = None;
    for (peer, slot) in socks.iter_mut().enumerate().take(rank) {
        let (peer_addr, peer_job) = match (peer, first) {
            (0, Some(entry)) => entry,
            _ => peer_entry(store, prefix, peer, deadline)?,
        };
        if peer_job != job {
            return Err(Error::network(format!(
                "rank {peer} published an address of another job under {prefix:?} (job \
                 {peer_job:#x}, rank 0's is {job:#x}): stale keys in the store?"
            )));
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
        let (sock, round_trip) = dial(hello, key, peer, peer_addr, deadline)?;
        shortest_round_trip = Some(shortest_round_trip.map_or(round_trip, |s| s.min(round_trip)));
        *slot = Some(sock);
        lower[peer] = Some(peer_addr);
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
            .map(|p| if p > rank { vec![None] } else { Vec::new() })
            .collect(),
        first_stream: 0,
    };
    accept_peers(&listener, &acceptor, &mut slots, deadline)?;
    for (slot, mut accepted) in socks.iter_mut().zip(slots.socks).skip(rank + 1) {
        *slot = accepted.pop().flatten();
    }
    Ok(Mesh {
        socks,
        job,
        udp: Some(udp),
        lower,
        round_trip: shortest_round_trip,
        listener: Some(listener),
    })
}

/// Connects to `peer` at `addr` as `hello` says (with a fresh nonce when keyed) and configures
/// the socket; returns it with the handshake's round trip.
fn dial(
    mut hello: Hello,
    key: Option<&AuthKey>,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<(TcpStream, Duration)> {
    if key.is_some() {
        hello.nonce = auth::nonce()?;
    }
    let mut sock = connect_with_retry(addr, deadline, peer)?;
    let round_trip = greet(&mut sock, &hello, key, peer, addr, deadline)?;
    configure(&sock)?;
    Ok((sock, round_trip))
}

/// Opens `streams - 1` more connections to every peer that `mesh` reaches across hosts
/// (lower ranks are dialled, higher ones accepted, as for the first), before `deadline`.
/// Returns them by peer (none for peers on this host, or with `streams` 1). Every rank must
/// pass the same `streams`.
pub fn connect_streams(
    mesh: &Mesh,
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
        let addr = mesh.lower[peer].ok_or_else(|| {
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
    };
    accept_peers(listener, &acceptor, &mut slots, deadline)?;
    for (peer, accepted) in slots.socks.into_iter().enumerate() {
        extra[peer].extend(accepted.into_iter().flatten());
    }
    Ok(extra)
}

/// The links' one-way latency, the same on every rank: half the shortest handshake round
/// trip of the highest rank (which connected to all the others), published under `prefix`.
/// `round_trip` is this rank's [`Mesh::round_trip`].
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

/// Whether `sock` joins two hosts: its ends have different addresses (loopback and ranks
/// that share a host do not). Both ends of a connection answer the same.
fn between_hosts(sock: &TcpStream) -> bool {
    match (sock.local_addr(), sock.peer_addr()) {
        (Ok(local), Ok(peer)) => local.ip() != peer.ip(),
        _ => false,
    }
}

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
/// open to each peer across them. Each rank streams [`PROBE_BYTES`] over `socks` (a fresh
/// [`Mesh`]'s, before any frame) to the next rank when that link joins two hosts, while timing
/// what the previous rank streams to it, and publishes that rate with its [`stream_window`];
/// rank 0 takes the slowest rate and the smallest window, asks `streams_for(rate, window)`
/// how many streams that needs, and publishes both under `prefix`. Costs a few ms and two
/// store round trips per group, only when it spans hosts.
pub fn agree_links(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    socks: &[Option<TcpStream>],
    deadline: Instant,
    streams_for: &dyn Fn(Option<u64>, u64) -> Result<usize>,
) -> Result<LinkAgreement> {
    // One rank sees every other; if none of its links joins two hosts, no link does.
    if !socks.iter().flatten().any(between_hosts) {
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
        for r in 1..size {
            let raw = store.get(&key(r), remaining(deadline))?;
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

pub fn pollfd(fd: i32, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// poll(2) for at most `timeout` (at least 1 ms); readiness is found by trying the I/O after.
pub fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd for the call's duration.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

#[cfg(test)]
mod tests;
