//! What the server's handle (`server.rs`), its event loop and the connections share: the
//! state the handle watches, the timeouts and the labels of the proofs. Below all three, so
//! that none of them imports another that imports it back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// A client that takes no byte of a pending answer for this long is dropped.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a client may take to authenticate before it is dropped.
pub(crate) const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Labels of the two proofs (a client's proof can never pass as the server's).
pub(crate) const CLIENT_LABEL: &[u8] = b"rustdist store client v1";
pub(crate) const SERVER_LABEL: &[u8] = b"rustdist store server v1";
/// What both ends of a TLS connection derive (RFC 5705) and bind the key's proofs to, so
/// that a man in the middle, with a TLS session to each, cannot relay them.
pub(crate) const EXPORTER_LABEL: &[u8] = b"EXPORTER-rustdist-store";
/// How a refusal for the connection cap starts (the client recognises it by this).
pub(crate) const LIMIT_REFUSAL: &str = "TCPStore connection limit reached";

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State shared by the server handle and the event loop.
#[derive(Default)]
pub(crate) struct Shared {
    pub stop: AtomicBool,
    /// Open connections (served and being refused), for [`TcpServer::wait_connections_closed`].
    pub conns: Mutex<usize>,
    pub conns_changed: Condvar,
    /// Clients that said Hello, for [`TcpServer::wait_workers`].
    pub workers: Mutex<usize>,
    pub workers_changed: Condvar,
}

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub fn set_conns(&self, n: usize) {
        *lock(&self.conns) = n;
        self.conns_changed.notify_all();
    }
}
