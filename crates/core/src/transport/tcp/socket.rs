//! A connected peer socket's setup: whether it joins two hosts, and the options every one gets
//! (TCP_NODELAY, non-blocking, a small send buffer on one host). Shared by the accepting and
//! the connecting side and by the link probes, so it sits below all three.

use std::net::TcpStream;

use socket2::SockRef;

use crate::error::{Error, Result};

/// Send buffer of a connection between two ranks on one host (loopback). The kernel's own
/// reaches `tcp_wmem`'s 4 MiB, so a sender ran megabytes ahead of its reader and both copies
/// ran from memory; with this much the reader copies out bytes still in cache (1.4x-2x on
/// large messages: docs/benchmarks.md, TCP on one host). 32 KiB stalls the links. Links
/// between hosts keep the kernel's, which their bandwidth-delay product needs.
pub(super) const HOST_LOCAL_SEND_BUFFER_BYTES: usize = 128 << 10;

pub(super) fn configure(sock: &TcpStream) -> Result<()> {
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

/// Whether `sock` joins two hosts: its ends have different addresses (loopback and ranks
/// that share a host do not). Both ends of a connection answer the same.
pub fn between_hosts(sock: &TcpStream) -> bool {
    match (sock.local_addr(), sock.peer_addr()) {
        (Ok(local), Ok(peer)) => local.ip() != peer.ip(),
        _ => false,
    }
}
