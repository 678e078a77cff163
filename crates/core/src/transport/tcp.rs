//! TCP transport: a full mesh of non-blocking sockets between the ranks of a group, driven by one
//! progress loop per call (poll(2) over every peer).
//!
//! Every frame starts with a fixed header carrying the group, the collective's sequence number,
//! the message's step within it and the collective's [`Signature`], so that messages of
//! different collectives, groups and point-to-point tags never mix, and a rank that called a
//! different collective, dtype or size is caught on the first message. The loop always reads
//! from every peer, so a peer that dies (EOF) or aborts is noticed by every rank at once, not
//! only by its ring neighbours. Errors are sticky: once failed, the transport fails every call.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::reduce;
use crate::spin::Spin;
use crate::store::Store;
use crate::transport::shm::{Segment, ShmHost, ShmPipe};
use crate::transport::{Op, OpCtx, Signature, Transport};
use crate::types::{CollectiveKind, DType, ReduceOp};

const MAGIC: u32 = 0x5244_5354; // "RDST"
const HELLO_MAGIC: u32 = 0x5244_4845; // "RDHE"
const HEADER_LEN: usize = 40;
const HELLO_LEN: usize = 16;
/// Bytes read at once into a stash (a claimed length is never allocated before it arrives).
const STASH_CHUNK: usize = 4 << 20;

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameKind {
    Collective = 1,
    Tagged = 2,
    Abort = 3,
    Goodbye = 4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: FrameKind,
    /// Collective kind; for `Abort`, the error class (see [`abort_class`]).
    coll: u8,
    dtype: u8,
    op: u8,
    group: u32,
    step: u32,
    /// Collective sequence number, or the tag of a tagged message.
    seq: u64,
    count: u64,
    len: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.coll;
        b[6] = self.dtype;
        b[7] = self.op;
        b[8..12].copy_from_slice(&self.group.to_le_bytes());
        b[12..16].copy_from_slice(&self.step.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_LEN], peer: usize) -> Result<Header> {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let long = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if word(0) != MAGIC {
            return Err(Error::network(format!(
                "rank {peer} sent a malformed frame (bad magic {:#x})",
                word(0)
            )));
        }
        let kind = match b[4] {
            1 => FrameKind::Collective,
            2 => FrameKind::Tagged,
            3 => FrameKind::Abort,
            4 => FrameKind::Goodbye,
            other => {
                return Err(Error::network(format!(
                    "rank {peer} sent a malformed frame (kind {other})"
                )))
            }
        };
        Ok(Header {
            kind,
            coll: b[5],
            dtype: b[6],
            op: b[7],
            group: word(8),
            step: word(12),
            seq: long(16),
            count: long(24),
            len: long(32),
        })
    }

    fn collective(group: u32, ctx: &OpCtx, step: u32, len: usize) -> Header {
        Header {
            kind: FrameKind::Collective,
            coll: ctx.sig.kind as u8,
            dtype: ctx.sig.dtype as u8,
            op: ctx.sig.op as u8,
            group,
            step,
            seq: ctx.seq,
            count: ctx.sig.count,
            len: len as u64,
        }
    }
}

fn abort_class(e: &Error) -> u8 {
    match e {
        Error::Network(_) => 1,
        _ => 2,
    }
}

fn error_from_abort(class: u8, msg: String) -> Error {
    if class == 1 {
        Error::Network(msg)
    } else {
        Error::Backend(msg)
    }
}

/// A complete frame read before anyone asked for it.
struct Frame {
    hdr: Header,
    payload: Vec<u8>,
}

/// Where the bytes of the frame being read from a peer go.
enum Rx {
    /// Reading a header.
    Header { buf: [u8; HEADER_LEN], got: usize },
    /// Streaming into the posted receive `idx` of the current call.
    Posted { idx: usize },
    /// Collecting a frame nobody asked for yet.
    Stash { frame: Frame, got: usize },
}

/// The byte pipe to one peer: its TCP connection, and a shared-memory pipe when the peer shares
/// the host (the socket then only tells whether the peer is alive).
struct Link {
    sock: TcpStream,
    shm: Option<ShmPipe>,
}

impl Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.shm {
            Some(pipe) => pipe.read(buf),
            None => self.sock.read(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &mut self.shm {
            Some(pipe) => pipe.write_vectored(bufs),
            None => self.sock.write_vectored(bufs),
        }
    }

    /// For a shared-memory link: false once the peer's socket reports EOF or an error.
    fn alive(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self.sock.read(&mut probe) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => {
                e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted
            }
        }
    }
}

struct Peer {
    link: Link,
    rx: Rx,
    /// Collective frames received ahead of their receive (FIFO per peer).
    collective: VecDeque<Frame>,
    /// Tagged frames waiting for a matching receive.
    tagged: VecDeque<Frame>,
    /// Set once the peer said goodbye; its EOF is then not a failure.
    left: bool,
    closed: bool,
    /// Scratch for `RecvReduce`: incoming bytes before they are reduced into place.
    scratch: Vec<u8>,
}

/// One receive of the current call.
struct PendingRecv<'a> {
    peer: usize,
    step: u32,
    buf: &'a mut [u8],
    reduce: bool,
    /// True once the frame's header was matched to this receive.
    started: bool,
    got: usize,
    reduced: usize,
    done: bool,
}

/// One send of the current call: header and payload, written as far as the socket takes.
struct PendingSend<'a> {
    peer: usize,
    header: [u8; HEADER_LEN],
    data: &'a [u8],
    off: usize,
}

impl PendingSend<'_> {
    fn total(&self) -> usize {
        HEADER_LEN + self.data.len()
    }
    fn done(&self) -> bool {
        self.off == self.total()
    }
}

/// What a call of the progress loop waits for, besides its sends and receives.
enum Want<'a> {
    Nothing,
    Tagged {
        src: Option<usize>,
        tag: i64,
        buf: &'a mut [u8],
        from: Option<usize>,
    },
}

/// A full TCP mesh for one group.
pub struct TcpTransport {
    rank: usize,
    size: usize,
    group: u32,
    peers: Vec<Option<Peer>>,
    /// Collective sequence number of the current message counters.
    seq: u64,
    sent_steps: Vec<u32>,
    recv_steps: Vec<u32>,
    failed: Option<Error>,
    /// Shared memory with the peers on this host; after `peers`, so the pipes go first.
    host: Option<ShmHost>,
}

/// The address to listen on: `RUSTDIST_SOCKET_IFNAME` / `GLOO_SOCKET_IFNAME` when set, else the
/// local address that routes to MASTER_ADDR, else loopback.
fn listen_ip() -> Result<IpAddr> {
    for var in ["RUSTDIST_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"] {
        if let Ok(name) = std::env::var(var) {
            return interface_ip(&name);
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

fn interface_ip(name: &str) -> Result<IpAddr> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return Err(Error::network(format!(
            "cannot list network interfaces: {}",
            io::Error::last_os_error()
        )));
    }
    let mut found = None;
    let mut cur = addrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned, alive until freed.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let ifname = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if ifname.to_bytes() == name.as_bytes() && !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr is non-null; the family says which sockaddr it is.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if family == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                found = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `addrs` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(addrs) };
    found.ok_or_else(|| Error::invalid(format!("network interface {name:?} has no IPv4 address")))
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

fn connect_with_retry(addr: SocketAddr, deadline: Instant, peer: usize) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(1);
    loop {
        let left = remaining(deadline).ok_or_else(|| {
            Error::network(format!("timed out connecting to rank {peer} at {addr}"))
        })?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::thread::sleep(backoff.min(left));
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

fn hello(group: u32, rank: usize) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&group.to_le_bytes());
    b[8..16].copy_from_slice(&(rank as u64).to_le_bytes());
    b
}

/// Reads a peer's hello; `None` for a connection that is not one of ours (dropped).
fn read_hello(sock: &mut TcpStream, group: u32, size: usize, deadline: Instant) -> Option<usize> {
    let left = remaining(deadline)?.min(Duration::from_secs(5));
    sock.set_read_timeout(Some(left)).ok()?;
    let mut b = [0u8; HELLO_LEN];
    sock.read_exact(&mut b).ok()?;
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let their_group = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let mut r = [0u8; 8];
    r.copy_from_slice(&b[8..16]);
    let rank = u64::from_le_bytes(r) as usize;
    (magic == HELLO_MAGIC && their_group == group && rank < size).then_some(rank)
}

fn configure(sock: &TcpStream) -> Result<()> {
    sock.set_nodelay(true)
        .and_then(|_| sock.set_nonblocking(true))
        .map_err(|e| Error::network(format!("cannot configure socket: {e}")))
}

impl TcpTransport {
    /// Builds the mesh: publishes this rank's listening address under `{prefix}/addr/{rank}`,
    /// connects to every lower rank and accepts every higher one, all within `timeout`.
    pub fn connect(
        store: Arc<dyn Store>,
        prefix: &str,
        rank: usize,
        size: usize,
        group: u32,
        timeout: Duration,
    ) -> Result<TcpTransport> {
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} is out of range for a group of size {size}"
            )));
        }
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Option<Peer>> = (0..size).map(|_| None).collect();
        if size > 1 {
            let listener = TcpListener::bind((listen_ip()?, 0))
                .map_err(|e| Error::network(format!("cannot listen: {e}")))?;
            let addr = listener
                .local_addr()
                .map_err(|e| Error::network(format!("cannot read listening address: {e}")))?;
            store.set(
                &format!("{prefix}/addr/{rank}"),
                addr.to_string().as_bytes(),
            )?;
            for (peer, slot) in peers.iter_mut().enumerate().take(rank) {
                let raw = store.get(&format!("{prefix}/addr/{peer}"), remaining(deadline))?;
                let text = String::from_utf8_lossy(&raw);
                let peer_addr: SocketAddr = text.parse().map_err(|_| {
                    Error::network(format!("rank {peer} published a bad address {text:?}"))
                })?;
                let mut sock = connect_with_retry(peer_addr, deadline, peer)?;
                sock.write_all(&hello(group, rank))
                    .map_err(|e| Error::network(format!("cannot greet rank {peer}: {e}")))?;
                *slot = Some(Peer::new(sock)?);
            }
            listener
                .set_nonblocking(true)
                .map_err(|e| Error::network(format!("cannot configure listener: {e}")))?;
            let mut missing = size - 1 - rank;
            while missing > 0 {
                match listener.accept() {
                    Ok((mut sock, _)) => {
                        sock.set_nonblocking(false).ok();
                        match read_hello(&mut sock, group, size, deadline) {
                            Some(peer) if peer > rank && peers[peer].is_none() => {
                                peers[peer] = Some(Peer::new(sock)?);
                                missing -= 1;
                            }
                            _ => drop(sock),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let left = remaining(deadline).ok_or_else(|| {
                            let absent: Vec<String> = (rank + 1..size)
                                .filter(|&p| peers[p].is_none())
                                .map(|p| p.to_string())
                                .collect();
                            Error::network(format!(
                                "rank {rank} timed out waiting for ranks [{}] to connect",
                                absent.join(", ")
                            ))
                        })?;
                        poll_fds(
                            &mut [pollfd(listener.as_raw_fd(), libc::POLLIN)],
                            left.min(Duration::from_millis(100)),
                        );
                    }
                    Err(e) => return Err(Error::network(format!("accept failed: {e}"))),
                }
            }
        }
        let host = share_memory(&*store, prefix, rank, size, group, &mut peers, deadline)?;
        Ok(TcpTransport {
            rank,
            size,
            group,
            host,
            peers,
            seq: u64::MAX,
            sent_steps: vec![0; size],
            recv_steps: vec![0; size],
            failed: None,
        })
    }

    fn peer(&mut self, p: usize) -> Result<&mut Peer> {
        let size = self.size;
        self.peers
            .get_mut(p)
            .and_then(|x| x.as_mut())
            .ok_or_else(|| {
                Error::invalid(format!("rank {p} is not a peer in a group of size {size}"))
            })
    }

    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
        e
    }

    fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Restarts the per-peer message counters when a new collective begins.
    fn enter(&mut self, seq: u64) {
        if self.seq != seq {
            self.seq = seq;
            self.sent_steps.iter_mut().for_each(|s| *s = 0);
            self.recv_steps.iter_mut().for_each(|s| *s = 0);
        }
    }

    /// The progress loop: writes `sends`, fills `recvs` and `want`, reading every peer all the
    /// while, until everything is done, a peer fails, or `deadline` passes.
    fn progress(
        &mut self,
        ctx: Option<&OpCtx>,
        sends: &mut [PendingSend<'_>],
        recvs: &mut [PendingRecv<'_>],
        want: &mut Want<'_>,
        deadline: Instant,
    ) -> Result<()> {
        for s in sends.iter() {
            self.peer(s.peer)?;
        }
        for r in recvs.iter() {
            self.peer(r.peer)?;
        }
        // Receives that can be served from frames that arrived earlier.
        for i in 0..recvs.len() {
            self.match_stashed(ctx, recvs, i)?;
        }
        let mut spin = Spin::new();
        loop {
            let mut moved = false;
            for s in sends.iter_mut().filter(|s| !s.done()) {
                moved |= self.write_some(s)?;
            }
            for p in 0..self.size {
                if p != self.rank {
                    moved |= self.read_peer(p, ctx, recvs)?;
                }
            }
            if self.take_tagged(want)? && sends.iter().all(|s| s.done()) {
                return Ok(());
            }
            let all_done = sends.iter().all(|s| s.done()) && recvs.iter().all(|r| r.done);
            if all_done && matches!(want, Want::Nothing) {
                return Ok(());
            }
            self.check_needed_peers(sends, recvs, want)?;
            if moved {
                spin = Spin::new();
                continue;
            }
            if spin.again() {
                continue;
            }
            let Some(left) = remaining(deadline) else {
                let what = match ctx {
                    Some(c) => format!("{} (collective #{})", c.sig.kind.name(), c.seq),
                    None => "point-to-point operation".to_string(),
                };
                return Err(Error::backend(format!(
                    "rank {}: {what} timed out waiting for its peers",
                    self.rank
                )));
            };
            self.block(sends, left)?;
            spin = Spin::new();
        }
    }

    /// Sleeps until a peer may have made progress possible, or `left` passes: poll(2) on the
    /// sockets, or the shared-memory doorbell (in short naps, checking that peers are alive).
    fn block(&mut self, sends: &[PendingSend<'_>], left: Duration) -> Result<()> {
        let writing = |p: usize| sends.iter().any(|s| s.peer == p && !s.done());
        if let Some(host) = &self.host {
            let all_shm = self.peers.iter().flatten().all(|p| p.link.shm.is_some());
            let nap = left.min(Duration::from_millis(if all_shm { 5 } else { 1 }));
            let peers = &self.peers;
            host.sleep(nap, || {
                peers.iter().enumerate().any(|(p, peer)| {
                    let Some(pipe) = peer.as_ref().and_then(|x| x.link.shm.as_ref()) else {
                        return false;
                    };
                    pipe.has_data() || (writing(p) && pipe.has_space())
                })
            });
            for p in 0..self.size {
                let Some(peer) = self.peers[p].as_mut() else {
                    continue;
                };
                if peer.link.shm.is_some() && !peer.closed && !peer.link.alive() {
                    peer.closed = true;
                    if !peer.left {
                        let rank = self.rank;
                        return Err(self.fail(Error::network(format!(
                            "rank {p} closed its connection to rank {rank} unexpectedly; it probably died"
                        ))));
                    }
                }
            }
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.size);
        for (p, peer) in self.peers.iter().enumerate() {
            let Some(peer) = peer else { continue };
            if peer.closed {
                continue;
            }
            let events = if writing(p) {
                libc::POLLIN | libc::POLLOUT
            } else {
                libc::POLLIN
            };
            fds.push(pollfd(peer.link.sock.as_raw_fd(), events));
        }
        poll_fds(&mut fds, left);
        Ok(())
    }

    /// Errors when an operation still needs a peer that has left.
    fn check_needed_peers(
        &self,
        sends: &[PendingSend<'_>],
        recvs: &[PendingRecv<'_>],
        want: &Want<'_>,
    ) -> Result<()> {
        let gone = |p: usize| self.peers[p].as_ref().is_some_and(|x| x.closed);
        let needed = sends
            .iter()
            .filter(|s| !s.done())
            .map(|s| s.peer)
            .chain(recvs.iter().filter(|r| !r.done).map(|r| r.peer));
        let mut needed: Vec<usize> = needed.collect();
        if let Want::Tagged { src: Some(src), .. } = want {
            needed.push(*src);
        }
        if let Some(p) = needed.into_iter().find(|&p| gone(p)) {
            return Err(Error::network(format!(
                "rank {p} has left the group (it destroyed its process group or exited) while rank {} still needs it",
                self.rank
            )));
        }
        Ok(())
    }

    fn write_some(&mut self, s: &mut PendingSend<'_>) -> Result<bool> {
        let peer_rank = s.peer;
        let link = &mut self.peer(peer_rank)?.link;
        let mut moved = false;
        while !s.done() {
            let res = if s.off < HEADER_LEN {
                link.write_vectored(&[IoSlice::new(&s.header[s.off..]), IoSlice::new(s.data)])
            } else {
                link.write_vectored(&[IoSlice::new(&s.data[s.off - HEADER_LEN..])])
            };
            match res {
                Ok(0) => {
                    return Err(self.fail(Error::network(format!(
                        "connection to rank {peer_rank} closed while sending"
                    ))))
                }
                Ok(n) => {
                    s.off += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(self.fail(Error::network(format!(
                        "rank {peer_rank} is unreachable (sending failed: {e}); it probably died"
                    ))))
                }
            }
        }
        Ok(moved)
    }

    /// Reads whatever peer `p` has sent, routing frames to receives or stashes.
    fn read_peer(
        &mut self,
        p: usize,
        ctx: Option<&OpCtx>,
        recvs: &mut [PendingRecv<'_>],
    ) -> Result<bool> {
        let mut moved = false;
        loop {
            let rank = self.rank;
            let peer = self.peers[p]
                .as_mut()
                .ok_or_else(|| Error::invalid("no such peer"))?;
            if peer.closed {
                return Ok(moved);
            }
            let res = match &mut peer.rx {
                Rx::Header { buf, got } => peer.link.read(&mut buf[*got..]),
                Rx::Posted { idx } => {
                    let r = &mut recvs[*idx];
                    if r.reduce {
                        peer.link.read(&mut peer.scratch[r.got..r.buf.len()])
                    } else {
                        peer.link.read(&mut r.buf[r.got..])
                    }
                }
                Rx::Stash { frame, got } => {
                    let want = (frame.hdr.len as usize - *got).min(STASH_CHUNK);
                    if frame.payload.len() < *got + want {
                        frame.payload.resize(*got + want, 0);
                    }
                    peer.link.read(&mut frame.payload[*got..*got + want])
                }
            };
            let n = match res {
                Ok(0) => {
                    peer.closed = true;
                    if peer.left && matches!(peer.rx, Rx::Header { got: 0, .. }) {
                        return Ok(true);
                    }
                    return Err(self.fail(Error::network(format!(
                        "rank {p} closed its connection to rank {rank} unexpectedly; it probably died"
                    ))));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    peer.closed = true;
                    return Err(self.fail(Error::network(format!(
                        "connection from rank {p} to rank {rank} failed ({e}); rank {p} probably died"
                    ))));
                }
            };
            moved = true;
            self.advance(p, n, ctx, recvs)?;
        }
    }

    /// Accounts for `n` bytes just read from peer `p`.
    fn advance(
        &mut self,
        p: usize,
        n: usize,
        ctx: Option<&OpCtx>,
        recvs: &mut [PendingRecv<'_>],
    ) -> Result<()> {
        let peer = self.peers[p]
            .as_mut()
            .ok_or_else(|| Error::invalid("no such peer"))?;
        match &mut peer.rx {
            Rx::Header { buf, got } => {
                *got += n;
                if *got < HEADER_LEN {
                    return Ok(());
                }
                let hdr = match Header::decode(buf, p) {
                    Ok(h) => h,
                    Err(e) => return Err(self.fail(e)),
                };
                self.on_header(p, hdr, ctx, recvs)
            }
            Rx::Posted { idx } => {
                let idx = *idx;
                let r = &mut recvs[idx];
                r.got += n;
                if r.reduce {
                    let dtype = ctx.map(|c| c.sig.dtype).unwrap_or(DType::U8);
                    let op = ctx.map(|c| c.reduce).unwrap_or(ReduceOp::Sum);
                    let esize = dtype.size();
                    let upto = if r.got == r.buf.len() {
                        r.got
                    } else {
                        r.got - r.got % esize
                    };
                    if upto > r.reduced {
                        reduce::reduce_into(
                            dtype,
                            op,
                            &mut r.buf[r.reduced..upto],
                            &peer.scratch[r.reduced..upto],
                        )?;
                        r.reduced = upto;
                    }
                }
                if r.got == r.buf.len() {
                    r.done = true;
                    peer.rx = Rx::Header {
                        buf: [0; HEADER_LEN],
                        got: 0,
                    };
                }
                Ok(())
            }
            Rx::Stash { frame, got } => {
                *got += n;
                if *got as u64 == frame.hdr.len {
                    let done = std::mem::replace(
                        &mut peer.rx,
                        Rx::Header {
                            buf: [0; HEADER_LEN],
                            got: 0,
                        },
                    );
                    if let Rx::Stash { frame, .. } = done {
                        self.on_frame(p, frame, ctx, recvs)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// A header arrived from `p`: stream the payload into a posted receive when it is the one
    /// expected next, else into a stash.
    fn on_header(
        &mut self,
        p: usize,
        hdr: Header,
        ctx: Option<&OpCtx>,
        recvs: &mut [PendingRecv<'_>],
    ) -> Result<()> {
        let group = self.group;
        if hdr.group != group {
            return Err(self.fail(Error::network(format!(
                "rank {p} sent a frame of another group ({:#x}, expected {group:#x})",
                hdr.group
            ))));
        }
        if hdr.kind == FrameKind::Collective {
            if let (Some(ctx), Some(idx)) = (ctx, next_recv_from(recvs, p)) {
                let expected_step = recvs[idx].step;
                if let Err(e) = self.check_frame(p, &hdr, ctx, expected_step, recvs[idx].buf.len())
                {
                    return Err(self.fail(e));
                }
                let r = &mut recvs[idx];
                r.started = true;
                let peer = self.peers[p]
                    .as_mut()
                    .ok_or_else(|| Error::invalid("no such peer"))?;
                if r.buf.is_empty() {
                    r.done = true;
                    peer.rx = Rx::Header {
                        buf: [0; HEADER_LEN],
                        got: 0,
                    };
                    return Ok(());
                }
                if r.reduce && peer.scratch.len() < r.buf.len() {
                    peer.scratch.resize(r.buf.len(), 0);
                }
                peer.rx = Rx::Posted { idx };
                return Ok(());
            }
        }
        let frame = Frame {
            hdr,
            payload: Vec::new(),
        };
        if hdr.len == 0 {
            let peer = self.peers[p]
                .as_mut()
                .ok_or_else(|| Error::invalid("no such peer"))?;
            peer.rx = Rx::Header {
                buf: [0; HEADER_LEN],
                got: 0,
            };
            return self.on_frame(p, frame, ctx, recvs);
        }
        let peer = self.peers[p]
            .as_mut()
            .ok_or_else(|| Error::invalid("no such peer"))?;
        peer.rx = Rx::Stash { frame, got: 0 };
        Ok(())
    }

    /// A whole frame arrived that no receive was streaming into.
    fn on_frame(
        &mut self,
        p: usize,
        frame: Frame,
        ctx: Option<&OpCtx>,
        recvs: &mut [PendingRecv<'_>],
    ) -> Result<()> {
        let peer = self.peers[p]
            .as_mut()
            .ok_or_else(|| Error::invalid("no such peer"))?;
        match frame.hdr.kind {
            FrameKind::Abort => {
                let why = String::from_utf8_lossy(&frame.payload);
                let e = error_from_abort(frame.hdr.coll, format!("rank {p} failed: {why}"));
                Err(self.fail(e))
            }
            FrameKind::Goodbye => {
                peer.left = true;
                Ok(())
            }
            FrameKind::Tagged => {
                peer.tagged.push_back(frame);
                Ok(())
            }
            FrameKind::Collective => {
                peer.collective.push_back(frame);
                if let Some(idx) = next_recv_from(recvs, p) {
                    self.match_stashed(ctx, recvs, idx)?;
                }
                Ok(())
            }
        }
    }

    /// Serves receive `idx` from its peer's stash when the frame it expects is there.
    fn match_stashed(
        &mut self,
        ctx: Option<&OpCtx>,
        recvs: &mut [PendingRecv<'_>],
        idx: usize,
    ) -> Result<()> {
        let p = recvs[idx].peer;
        if recvs[idx].done || recvs[idx].started || next_recv_from(recvs, p) != Some(idx) {
            return Ok(());
        }
        let Some(ctx) = ctx else { return Ok(()) };
        let peer = self.peers[p]
            .as_mut()
            .ok_or_else(|| Error::invalid("no such peer"))?;
        let Some(frame) = peer.collective.pop_front() else {
            return Ok(());
        };
        if let Err(e) = self.check_frame(p, &frame.hdr, ctx, recvs[idx].step, recvs[idx].buf.len())
        {
            return Err(self.fail(e));
        }
        let r = &mut recvs[idx];
        if r.reduce {
            reduce::reduce_into(ctx.sig.dtype, ctx.reduce, r.buf, &frame.payload)?;
        } else {
            r.buf.copy_from_slice(&frame.payload);
        }
        r.got = r.buf.len();
        r.done = true;
        Ok(())
    }

    /// Checks a collective frame from `p` against what this rank expects next from it.
    fn check_frame(
        &self,
        p: usize,
        hdr: &Header,
        ctx: &OpCtx,
        step: u32,
        len: usize,
    ) -> Result<()> {
        let me = self.rank;
        let ours = ctx.sig;
        if hdr.seq != ctx.seq {
            return Err(Error::backend(format!(
                "collective mismatch: rank {me} is at collective #{} ({}) but rank {p} sent data of collective #{} ({}); ranks called a different number of collectives",
                ctx.seq,
                ours.kind.name(),
                hdr.seq,
                collective_name(hdr)
            )));
        }
        if let Some(diff) = signature_diff(&ours, hdr) {
            return Err(Error::backend(format!(
                "{} mismatch between ranks: {diff} (rank {me} vs rank {p}, collective #{})",
                ours.kind.name(),
                ctx.seq
            )));
        }
        if hdr.step != step || hdr.len as usize != len {
            return Err(Error::backend(format!(
                "{} mismatch between ranks: rank {me} expected message {step} of {len} bytes from rank {p}, got message {} of {} bytes",
                ours.kind.name(),
                hdr.step,
                hdr.len
            )));
        }
        Ok(())
    }

    /// Completes a pending tagged receive from the stash; true when done.
    fn take_tagged(&mut self, want: &mut Want<'_>) -> Result<bool> {
        let Want::Tagged {
            src,
            tag,
            buf,
            from,
        } = want
        else {
            return Ok(false);
        };
        if from.is_some() {
            return Ok(true);
        }
        let wanted = *tag as u64;
        let candidates: Vec<usize> = match src {
            Some(s) => vec![*s],
            None => (0..self.size).filter(|&p| p != self.rank).collect(),
        };
        for p in candidates {
            let Some(peer) = self.peers[p].as_mut() else {
                continue;
            };
            let Some(pos) = peer.tagged.iter().position(|f| f.hdr.seq == wanted) else {
                continue;
            };
            let frame = peer
                .tagged
                .remove(pos)
                .ok_or_else(|| Error::invalid("stash"))?;
            if frame.payload.len() != buf.len() {
                return Err(Error::backend(format!(
                    "recv size mismatch: rank {} posted a receive of {} bytes (tag {tag}) but rank {p} sent {} bytes",
                    self.rank,
                    buf.len(),
                    frame.payload.len()
                )));
            }
            buf.copy_from_slice(&frame.payload);
            *from = Some(p);
            return Ok(true);
        }
        Ok(false)
    }

    fn send_control(&mut self, kind: FrameKind, class: u8, payload: &[u8]) {
        let hdr = Header {
            kind,
            coll: class,
            dtype: 0,
            op: 0,
            group: self.group,
            step: 0,
            seq: 0,
            count: 0,
            len: payload.len() as u64,
        }
        .encode();
        let deadline = Instant::now() + Duration::from_millis(200);
        for p in 0..self.size {
            let Some(peer) = self.peers[p].as_mut() else {
                continue;
            };
            if peer.closed {
                continue;
            }
            // Best effort: a peer that does not drain its socket in time gets no notice and
            // finds out from the closed connection instead.
            let mut frame = hdr.to_vec();
            frame.extend_from_slice(payload);
            let mut off = 0;
            while off < frame.len() && Instant::now() < deadline {
                match peer.link.write_vectored(&[IoSlice::new(&frame[off..])]) {
                    Ok(0) => break,
                    Ok(n) => off += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
    }
}

/// Identifies this machine (and boot), so that ranks can tell which peers share memory with it.
fn host_identity() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `name.len()` bytes into the buffer.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr() as *mut libc::c_char, name.len()) } == 0;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let host = if ok {
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        String::new()
    };
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{host}/{}", boot.trim())
}

/// Sets up shared-memory pipes to the peers on this host (unless `RUSTDIST_SHM=0`). A rank that
/// cannot create its segment publishes none, and its pairs stay on TCP.
fn share_memory(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    group: u32,
    peers: &mut [Option<Peer>],
    deadline: Instant,
) -> Result<Option<ShmHost>> {
    let enabled = std::env::var("RUSTDIST_SHM").map_or(true, |v| v != "0");
    if size == 1 || !enabled {
        return Ok(None);
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "/rustdist-{}-{group:x}-{rank}-{stamp:x}",
        std::process::id()
    );
    let own = Segment::create(&name, size).ok();
    let published = match &own {
        Some(_) => format!("{}\n{name}", host_identity()),
        None => String::new(),
    };
    store.set(&format!("{prefix}/shm/{rank}"), published.as_bytes())?;
    let Some(own) = own else { return Ok(None) };
    let me = host_identity();
    let mut segments: Vec<Option<Segment>> = (0..size).map(|_| None).collect();
    for (p, slot) in segments.iter_mut().enumerate() {
        if p == rank {
            continue;
        }
        let raw = store.get(&format!("{prefix}/shm/{p}"), remaining(deadline))?;
        let text = String::from_utf8_lossy(&raw);
        if let Some((host, seg)) = text.split_once('\n') {
            if host == me {
                *slot = Some(Segment::open(seg, size)?);
            }
        }
    }
    // Once every local peer has mapped our segment its name can go: nothing leaks in /dev/shm.
    store.set(&format!("{prefix}/shm_mapped/{rank}"), b"1")?;
    let local: Vec<String> = (0..size)
        .filter(|&p| segments[p].is_some())
        .map(|p| format!("{prefix}/shm_mapped/{p}"))
        .collect();
    if local.is_empty() {
        return Ok(None);
    }
    store.wait(&local, remaining(deadline))?;
    let mut host = ShmHost::new(own, segments);
    host.unlink_own();
    for (p, peer) in peers.iter_mut().enumerate() {
        if let Some(peer) = peer {
            peer.link.shm = host.pipe(rank, p);
        }
    }
    Ok(Some(host))
}

fn next_recv_from(recvs: &[PendingRecv<'_>], p: usize) -> Option<usize> {
    recvs.iter().position(|r| r.peer == p && !r.done)
}

/// The collective a header belongs to, in words.
fn collective_name(hdr: &Header) -> String {
    CollectiveKind::from_code(hdr.coll)
        .map(|k| k.name().to_string())
        .unwrap_or_else(|_| format!("collective code {}", hdr.coll))
}

/// What differs between our signature and a peer's header, in words.
fn signature_diff(ours: &Signature, hdr: &Header) -> Option<String> {
    if ours.kind as u8 != hdr.coll {
        let theirs = collective_name(hdr);
        return Some(format!(
            "collective type differs: {} vs {theirs}",
            ours.kind.name()
        ));
    }
    if ours.dtype as u8 != hdr.dtype {
        let theirs = DType::from_code(hdr.dtype)
            .map(|d| d.name().to_string())
            .unwrap_or_else(|_| format!("dtype code {}", hdr.dtype));
        return Some(format!("dtype differs: {} vs {theirs}", ours.dtype.name()));
    }
    if ours.count != hdr.count {
        return Some(format!(
            "tensor size differs: {} vs {} elements",
            ours.count, hdr.count
        ));
    }
    if ours.op as u8 != hdr.op {
        let theirs = ReduceOp::from_code(hdr.op)
            .map(|o| o.name().to_string())
            .unwrap_or_else(|_| format!("op code {}", hdr.op));
        return Some(format!("reduce op differs: {} vs {theirs}", ours.op.name()));
    }
    None
}

fn pollfd(fd: i32, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd for the call's duration.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

impl Peer {
    fn new(sock: TcpStream) -> Result<Peer> {
        configure(&sock)?;
        Ok(Peer {
            link: Link { sock, shm: None },
            rx: Rx::Header {
                buf: [0; HEADER_LEN],
                got: 0,
            },
            collective: VecDeque::new(),
            tagged: VecDeque::new(),
            left: false,
            closed: false,
            scratch: Vec::new(),
        })
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn exchange(&mut self, ctx: &OpCtx, ops: &mut [Op<'_>]) -> Result<()> {
        self.check_failed()?;
        self.enter(ctx.seq);
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for op in ops.iter_mut() {
            let (peer, buf, reduce) = match op {
                Op::Send { peer, data } => {
                    let step = self.sent_steps[*peer];
                    self.sent_steps[*peer] += 1;
                    sends.push(PendingSend {
                        peer: *peer,
                        header: Header::collective(self.group, ctx, step, data.len()).encode(),
                        data,
                        off: 0,
                    });
                    continue;
                }
                Op::Recv { peer, buf } => (*peer, &mut **buf, false),
                Op::RecvReduce { peer, buf } => (*peer, &mut **buf, true),
            };
            let step = self.recv_steps[peer];
            self.recv_steps[peer] += 1;
            recvs.push(PendingRecv {
                peer,
                step,
                buf,
                reduce,
                started: false,
                got: 0,
                reduced: 0,
                done: false,
            });
        }
        self.progress(
            Some(ctx),
            &mut sends,
            &mut recvs,
            &mut Want::Nothing,
            ctx.deadline,
        )
    }

    fn send_tagged(&mut self, peer: usize, tag: i64, data: &[u8], deadline: Instant) -> Result<()> {
        self.check_failed()?;
        self.peer(peer)?;
        let header = Header {
            kind: FrameKind::Tagged,
            coll: CollectiveKind::SendRecv as u8,
            dtype: 0,
            op: 0,
            group: self.group,
            step: 0,
            seq: tag as u64,
            count: data.len() as u64,
            len: data.len() as u64,
        }
        .encode();
        let mut sends = [PendingSend {
            peer,
            header,
            data,
            off: 0,
        }];
        self.progress(None, &mut sends, &mut [], &mut Want::Nothing, deadline)
    }

    fn recv_tagged(
        &mut self,
        src: Option<usize>,
        tag: i64,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<usize> {
        self.check_failed()?;
        if let Some(s) = src {
            self.peer(s)?;
        }
        let mut want = Want::Tagged {
            src,
            tag,
            buf,
            from: None,
        };
        self.progress(None, &mut [], &mut [], &mut want, deadline)?;
        match want {
            Want::Tagged { from: Some(p), .. } => Ok(p),
            _ => Err(Error::backend("receive finished without a sender")),
        }
    }

    fn abort(&mut self, reason: &str) {
        let class = self.failed.as_ref().map(abort_class).unwrap_or(2);
        self.send_control(FrameKind::Abort, class, reason.as_bytes());
        if self.failed.is_none() {
            self.failed = Some(Error::backend(reason.to_string()));
        }
    }

    fn shutdown(&mut self) {
        if self.failed.is_none() {
            self.send_control(FrameKind::Goodbye, 0, &[]);
        }
        for peer in self.peers.iter_mut().flatten() {
            let _ = peer.link.sock.shutdown(std::net::Shutdown::Both);
            peer.closed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        let h = Header {
            kind: FrameKind::Collective,
            coll: 2,
            dtype: 3,
            op: 1,
            group: 0xabcd,
            step: 7,
            seq: 99,
            count: 12345,
            len: 4096,
        };
        assert_eq!(Header::decode(&h.encode(), 1).unwrap(), h);
        let mut bad = h.encode();
        bad[0] ^= 0xff;
        assert!(matches!(Header::decode(&bad, 1), Err(Error::Network(_))));
    }
}
