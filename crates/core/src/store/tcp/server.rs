//! The TCP store server: one thread runs a mio event loop (epoll) that serves every
//! connection, so the thread count stays constant however many ranks connect.
//!
//! - Each connection has its own read and write buffers; frames are parsed as bytes arrive,
//!   never allocated beyond what arrived, and capped at [`MAX_FRAME`] (or [`MAX_AUTH_FRAME`]
//!   before a client has authenticated). Malformed input closes only that connection.
//! - A blocking `get`/`wait` whose keys are missing is parked in a waiter table keyed by the
//!   keys it needs; a write to one of them re-checks it, and its deadline (a heap of timers
//!   that sets the poll timeout) answers it "timeout". A connection whose request is parked,
//!   or whose answer is not yet written, reads nothing more, as a thread per client would.
//! - A client that takes no bytes of an answer for `WRITE_TIMEOUT` is dropped; one that
//!   does not authenticate within `AUTH_TIMEOUT` too.
//! - Connections are capped (by default from `RLIMIT_NOFILE`, raised to its hard limit at
//!   start; `RUSTDIST_STORE_MAX_CLIENTS` overrides it). A client over the cap is told so in a
//!   [`Response::Error`] starting with `LIMIT_REFUSAL`, never dropped silently.
//! - Dropping the server wakes the loop (a [`mio::Waker`]), which closes every socket and exits.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use socket2::{Domain, Socket, Type};

use super::protocol::MAX_AUTH_FRAME;
#[cfg(doc)]
use super::protocol::{Response, MAX_FRAME};
use crate::auth::AuthKey;
use crate::error::{Error, Result};
use crate::tls::Tls;
use crate::{interrupt, netio};

use super::event_loop::EventLoop;
use super::shared::{lock, Shared, LIMIT_REFUSAL};

/// Overrides the connection cap (a positive number).
pub const MAX_CLIENTS_ENV: &str = "RUSTDIST_STORE_MAX_CLIENTS";

/// A running server. Dropping it stops the loop: every socket is closed before drop returns.
pub struct TcpServer {
    port: u16,
    max_clients: usize,
    shared: Arc<Shared>,
    waker: Arc<mio::Waker>,
    looper: Option<JoinHandle<()>>,
}

/// The address the server for `host` binds: `host` itself when it is (or names) an address of
/// this machine, else `None`: every interface. Empty, `0.0.0.0` and `::` mean every interface,
/// as in torch; `localhost` means 127.0.0.1. Another name that resolves only to loopback (a
/// hostname mapped to 127.0.1.1 in /etc/hosts, which other hosts resolve elsewhere) and an
/// address this machine does not have (behind NAT) also listen everywhere, so that clients
/// elsewhere still reach the server as they do torch's.
pub fn bind_address(host: &str) -> Option<IpAddr> {
    let local = |ip: IpAddr| UdpSocket::bind((ip, 0)).is_ok();
    if let Ok(ip) = host.parse::<IpAddr>() {
        return (!ip.is_unspecified() && local(ip)).then_some(ip);
    }
    if host.is_empty() {
        return None;
    }
    let addrs: Vec<IpAddr> = (host, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    addrs
        .iter()
        .copied()
        .find(|ip| !ip.is_loopback() && local(*ip))
        // IPv4 loopback, which clients naming "localhost" or "127.0.0.1" both reach.
        .or_else(|| (host == "localhost").then_some(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

/// Binds `port` (0: any free port) on the address [`bind_address`] picks for `host`, or on
/// every interface (IPv6 dual-stack when available), with SO_REUSEADDR so a restarted store
/// can bind the same port at once.
pub fn listen(host: &str, port: u16) -> Result<TcpListener> {
    let bind = |domain: Domain, addr: SocketAddr| -> io::Result<TcpListener> {
        let s = Socket::new(domain, Type::STREAM, None)?;
        if domain == Domain::IPV6 {
            s.set_only_v6(false)?;
        }
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        s.listen(netio::listen_backlog())?;
        Ok(s.into())
    };
    let listener = match bind_address(host) {
        Some(ip) => bind(Domain::for_address((ip, port).into()), (ip, port).into()),
        None => match bind(Domain::IPV6, (Ipv6Addr::UNSPECIFIED, port).into()) {
            Ok(l) => Ok(l),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(e),
            Err(_) => bind(Domain::IPV4, (Ipv4Addr::UNSPECIFIED, port).into()),
        },
    };
    listener
        .map_err(|e| Error::network(format!("TCPStore: cannot listen on ({host}, {port}): {e}")))
}

/// Raises the soft open-file limit to the hard one (best effort) and returns (soft, hard).
pub fn raise_fd_limit() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return (1024, 1024);
    }
    if lim.rlim_cur < lim.rlim_max {
        // An unlimited hard limit cannot be the soft one: Linux caps it at fs.nr_open.
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
            .unwrap_or(1 << 20);
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max.min(nr_open),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; a refusal leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = raised.rlim_cur;
        }
    }
    (lim.rlim_cur, lim.rlim_max)
}

/// The connection cap: `env` (`RUSTDIST_STORE_MAX_CLIENTS`) when a positive number, else the
/// open-file limit `soft` less a reserve for the rest of the process (the store usually lives
/// inside a training process).
pub(crate) fn default_max_clients(env: Option<&str>, soft: u64) -> usize {
    if let Some(n) = env
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    let reserve = (soft / 8).clamp(32, 1024);
    usize::try_from(soft.saturating_sub(reserve).max(1)).unwrap_or(usize::MAX)
}

impl TcpServer {
    /// Serves on `listener` (already bound and listening) until dropped; with `key`, only to
    /// clients that authenticate with it. The connection cap comes from the environment and
    /// the open-file limit (see [`TcpServer::start_with_limit`]).
    pub fn start(listener: TcpListener, key: Option<AuthKey>, tls: Option<&Tls>) -> Result<Self> {
        Self::start_with_limit(listener, key, tls, None)
    }

    /// [`TcpServer::start`] serving at most `max_clients` connections at once (`None`:
    /// `RUSTDIST_STORE_MAX_CLIENTS`, else the open-file limit less a reserve).
    pub fn start_with_limit(
        listener: TcpListener,
        key: Option<AuthKey>,
        tls: Option<&Tls>,
        max_clients: Option<usize>,
    ) -> Result<Self> {
        // Clients' chains are checked against the CA; with pinned keys none is asked for,
        // the key's proofs being bound to the session.
        let tls = tls.map(|t| t.server_config(None)).transpose()?;
        let setup = |e: io::Error| Error::network(format!("TCPStore server: {e}"));
        let port = listener.local_addr().map_err(setup)?.port();
        listener.set_nonblocking(true).map_err(setup)?;
        let (soft, _) = raise_fd_limit();
        let max_clients = max_clients
            .unwrap_or_else(|| {
                default_max_clients(std::env::var(MAX_CLIENTS_ENV).ok().as_deref(), soft)
            })
            .max(1);
        let shared = Arc::new(Shared::default());
        let mut refusal = format!(
            "{LIMIT_REFUSAL} ({max_clients} clients); raise {MAX_CLIENTS_ENV} and the server's \
             ulimit -n ({soft})"
        );
        // An authenticating client reads it as its first answer, which it caps at
        // MAX_AUTH_FRAME (less the status byte and the length).
        let fits = MAX_AUTH_FRAME - 5;
        if refusal.len() > fits {
            let cut = (0..=fits).rev().find(|&i| refusal.is_char_boundary(i));
            refusal.truncate(cut.unwrap_or(0));
        }
        let (event_loop, waker) = EventLoop::new(
            listener,
            key,
            tls,
            Arc::clone(&shared),
            max_clients,
            refusal,
        )
        .map_err(setup)?;
        let looper = thread::Builder::new()
            .name("rustdist-store".into())
            .spawn(move || event_loop.run())
            .map_err(setup)?;
        Ok(TcpServer {
            port,
            max_clients,
            shared,
            waker,
            looper: Some(looper),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many connections the server serves at once.
    pub fn max_clients(&self) -> usize {
        self.max_clients
    }

    /// Waits until `n` clients have announced themselves, or fails at `deadline`.
    pub fn wait_workers(&self, n: usize, deadline: Instant) -> Result<()> {
        let mut joined = lock(&self.shared.workers);
        while *joined < n {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::store(format!(
                    "TCPStore: timed out waiting for workers: {} of world_size {n} connected",
                    *joined
                )));
            }
            joined = interrupt::wait_timeout(&self.shared.workers_changed, joined, deadline - now)?;
        }
        Ok(())
    }

    /// Waits until no connection is open; false if some still are at `deadline`.
    pub fn wait_connections_closed(&self, deadline: Instant) -> bool {
        let mut open = lock(&self.shared.conns);
        while *open > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            open = match self.shared.conns_changed.wait_timeout(open, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(looper) = self.looper.take() {
            // A failed wake leaves the loop to notice `stop` at its next event or timer.
            let _ = self.waker.wake();
            // The loop closes the listener and every connection before it returns.
            let _ = looper.join();
        }
    }
}
