//! TCP connection setup: every rank listens, publishes its address in the store, connects to the
//! lower ranks and accepts the higher ones, each connection opened with a hello naming the group
//! and the rank.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::interrupt;
use crate::store::Store;
use crate::transport::remaining;

const HELLO_MAGIC: u32 = 0x5244_4845; // "RDHE"
const HELLO_LEN: usize = 16;

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

/// Connects this rank to every other rank of the group: publishes its listening address under
/// `{prefix}/addr/{rank}`, connects to every lower rank and accepts every higher one, all before
/// `deadline`. The sockets come back non-blocking with TCP_NODELAY, indexed by rank.
pub fn connect_mesh(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    group: u32,
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>> {
    let mut socks: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    if size <= 1 {
        return Ok(socks);
    }
    let listener = TcpListener::bind((listen_ip()?, 0))
        .map_err(|e| Error::network(format!("cannot listen: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::network(format!("cannot read listening address: {e}")))?;
    store.set(
        &format!("{prefix}/addr/{rank}"),
        addr.to_string().as_bytes(),
    )?;
    for (peer, slot) in socks.iter_mut().enumerate().take(rank) {
        let raw = store.get(&format!("{prefix}/addr/{peer}"), remaining(deadline))?;
        let text = String::from_utf8_lossy(&raw);
        let peer_addr: SocketAddr = text
            .parse()
            .map_err(|_| Error::network(format!("rank {peer} published a bad address {text:?}")))?;
        let mut sock = connect_with_retry(peer_addr, deadline, peer)?;
        sock.write_all(&hello(group, rank))
            .map_err(|e| Error::network(format!("cannot greet rank {peer}: {e}")))?;
        configure(&sock)?;
        *slot = Some(sock);
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
                    Some(peer) if peer > rank && socks[peer].is_none() => {
                        configure(&sock)?;
                        socks[peer] = Some(sock);
                        missing -= 1;
                    }
                    // Not one of ours (a stray or duplicate connection): drop it.
                    _ => drop(sock),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = remaining(deadline).ok_or_else(|| {
                    let absent: Vec<String> = (rank + 1..size)
                        .filter(|&p| socks[p].is_none())
                        .map(|p| p.to_string())
                        .collect();
                    Error::network(format!(
                        "rank {rank} timed out waiting for ranks [{}] to connect",
                        absent.join(", ")
                    ))
                })?;
                poll_fds(
                    &mut [pollfd(listener.as_raw_fd(), libc::POLLIN)],
                    interrupt::slice(left.min(Duration::from_millis(100))),
                );
                interrupt::check()?;
            }
            Err(e) => return Err(Error::network(format!("accept failed: {e}"))),
        }
    }
    Ok(socks)
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
