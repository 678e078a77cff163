//! The TCP store server: one thread accepts, one thread serves each connection (capped), so a
//! slow or hostile client only ever holds its own thread. A client that sends anything
//! malformed is disconnected; the others never notice. With an [`AuthKey`], a client must
//! authenticate before anything else it sends is read (see [`crate::auth`]); one that does not
//! is refused and logged.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket,
};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use super::protocol::{read_frame, Request, Response, MAX_AUTH_FRAME, MAX_FRAME};
use crate::auth::{self, AuthKey};
use crate::error::{Error, Result};
use crate::interrupt;
use crate::store::deadline_after;
use crate::store::hash::{MemKv, WaitError};

/// Connections served at once; more are accepted and closed at once.
const MAX_CONNECTIONS: usize = 8192;
/// Stack of a connection thread (it only decodes frames and touches the table).
const CONN_STACK: usize = 256 << 10;
/// A client that does not take a response within this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the accept loop checks for shutdown (dropping the server also wakes it at once).
const ACCEPT_POLL_MS: libc::c_int = 100;
/// How long dropping the server waits for its connection threads to exit.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client may take to authenticate before it is dropped.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Labels of the two proofs (a client's proof can never pass as the server's).
pub(crate) const CLIENT_LABEL: &[u8] = b"rustdist store client v1";
pub(crate) const SERVER_LABEL: &[u8] = b"rustdist store server v1";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Open connections, kept so that shutdown can close them.
#[derive(Default)]
struct Conns {
    next_id: u64,
    open: HashMap<u64, TcpStream>,
}

/// State shared by the server handle, the accept thread and the connection threads.
#[derive(Default)]
struct Shared {
    kv: MemKv,
    key: Option<AuthKey>,
    stop: AtomicBool,
    conns: Mutex<Conns>,
    conns_changed: Condvar,
    workers: Mutex<usize>,
    workers_changed: Condvar,
}

/// A running server. Dropping the last `Arc` stops it: the listening socket is closed, every
/// connection is shut down and the threads exit.
pub struct TcpServer {
    port: u16,
    /// The listening socket, owned by the accept thread until it exits.
    listen_fd: RawFd,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
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
        s.listen(1024)?;
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

impl TcpServer {
    /// Serves on `listener` (already bound and listening) until dropped; with `key`, only to
    /// clients that authenticate with it.
    pub fn start(listener: TcpListener, key: Option<AuthKey>) -> Result<Self> {
        let setup = |e: io::Error| Error::network(format!("TCPStore server: {e}"));
        let port = listener.local_addr().map_err(setup)?.port();
        listener.set_nonblocking(true).map_err(setup)?;
        let listen_fd = listener.as_raw_fd();
        let shared = Arc::new(Shared {
            key,
            ..Shared::default()
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("rustdist-store-accept".into())
                .spawn(move || shared.accept_loop(listener))
                .map_err(setup)?
        };
        Ok(TcpServer {
            port,
            listen_fd,
            shared,
            acceptor: Some(acceptor),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
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
        self.shared.wait_conns_closed(deadline)
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(acceptor) = self.acceptor.take() {
            // Wakes the accept thread's poll now (Linux): dropping a store must not wait.
            // SAFETY: the fd is the listener the accept thread owns until it is joined below.
            unsafe { libc::shutdown(self.listen_fd, libc::SHUT_RDWR) };
            // The listener is closed when the accept loop returns.
            let _ = acceptor.join();
        }
        for stream in lock(&self.shared.conns).open.values() {
            // Wakes a thread blocked reading or writing; a waiting one sees `stop`.
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        self.shared.wait_conns_closed(deadline_after(DRAIN_TIMEOUT));
    }
}

/// The authentication exchange at the start of a connection. A refused client is told why
/// (`Err(Some(why))`, for the log); `Err(None)`: it hung up before sending anything.
fn authenticate(key: &AuthKey, stream: &mut TcpStream) -> std::result::Result<(), Option<String>> {
    let io = |e: io::Error| Some(e.to_string());
    let refuse = |stream: &mut TcpStream, why: &str| {
        let _ = stream.write_all(&Response::AuthFailed(why.to_owned()).encode());
        Some(why.to_owned())
    };
    stream.set_read_timeout(Some(AUTH_TIMEOUT)).map_err(io)?;
    let first = read_frame(stream, MAX_AUTH_FRAME)
        .map_err(io)?
        .ok_or(None)?;
    let Ok(Request::AuthInit {
        nonce: client_nonce,
    }) = Request::decode(&first)
    else {
        return Err(refuse(
            stream,
            "this TCPStore server requires RUSTDIST_AUTH_KEY, and the client did not authenticate",
        ));
    };
    let nonce = auth::nonce().map_err(|e| Some(e.to_string()))?;
    let tag = key.tag(SERVER_LABEL, &[&client_nonce, &nonce]);
    stream
        .write_all(&Response::Challenge { nonce, tag }.encode())
        .map_err(io)?;
    let proof = read_frame(stream, MAX_AUTH_FRAME)
        .map_err(io)?
        .ok_or_else(|| Some("the client hung up during authentication".to_owned()))?;
    match Request::decode(&proof) {
        Ok(Request::AuthProof { tag })
            if key.verify(CLIENT_LABEL, &[&client_nonce, &nonce], &tag) => {}
        _ => {
            return Err(refuse(
                stream,
                "the client's RUSTDIST_AUTH_KEY differs from the TCPStore server's",
            ))
        }
    }
    stream
        .write_all(&Response::Ok.encode())
        .and_then(|()| stream.set_read_timeout(None))
        .map_err(io)
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        while !self.stopping() {
            // SAFETY: `pfd` is one valid pollfd for the duration of the call, and its fd is
            // owned by `listener`, which lives until this function returns.
            if unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) } <= 0 || self.stopping() {
                continue;
            }
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                // Out of fds or memory: back off instead of spinning, and keep serving.
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Registers `stream` and gives it a thread; drops it when over the cap or out of threads.
    fn admit(self: &Arc<Self>, stream: TcpStream) {
        let configured = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_nodelay(true))
            .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)));
        let Ok(registered) = configured.and_then(|()| stream.try_clone()) else {
            return;
        };
        let id = {
            let mut conns = lock(&self.conns);
            if conns.open.len() >= MAX_CONNECTIONS {
                return;
            }
            let id = conns.next_id;
            conns.next_id += 1;
            conns.open.insert(id, registered);
            id
        };
        let shared = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("rustdist-store-conn".into())
            .stack_size(CONN_STACK)
            .spawn(move || {
                shared.serve(stream);
                shared.forget(id);
            });
        if spawned.is_err() {
            self.forget(id);
        }
    }

    fn forget(&self, id: u64) {
        lock(&self.conns).open.remove(&id);
        self.conns_changed.notify_all();
    }

    fn wait_conns_closed(&self, deadline: Instant) -> bool {
        let mut conns = lock(&self.conns);
        while !conns.open.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            conns = match self.conns_changed.wait_timeout(conns, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }

    /// Answers requests until the client leaves, misbehaves, or the server stops.
    fn serve(&self, mut stream: TcpStream) {
        if let Some(key) = &self.key {
            match authenticate(key, &mut stream) {
                Ok(()) => {}
                // Left before saying anything (a probe, a client giving up): nothing to report.
                Err(None) => return,
                Err(Some(why)) => {
                    let from = stream.peer_addr().map_or("?".into(), |a| a.to_string());
                    log::warn!(
                        "TCPStore: refused a client from {from}: authentication failed: {why}"
                    );
                    return;
                }
            }
        }
        while let Ok(Some(frame)) = read_frame(&mut stream, MAX_FRAME) {
            if self.stopping() {
                return;
            }
            let Ok(req) = Request::decode(&frame) else {
                return;
            };
            drop(frame);
            let Some(resp) = self.handle(&stream, req) else {
                return;
            };
            if stream.write_all(&resp.encode()).is_err() {
                return;
            }
        }
    }

    /// True once the client hung up (or the server is stopping): ends a blocked wait early.
    fn client_gone(&self, stream: &TcpStream) -> bool {
        if self.stopping() || stream.set_nonblocking(true).is_err() {
            return true;
        }
        let peeked = stream.peek(&mut [0u8; 1]);
        if stream.set_nonblocking(false).is_err() {
            return true;
        }
        match peeked {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    /// Waits for `keys` for the client's `timeout_ms`; `None` when the client left meanwhile.
    fn wait(
        &self,
        stream: &TcpStream,
        keys: &[String],
        timeout_ms: u64,
        want_values: bool,
    ) -> Option<Response> {
        let deadline = deadline_after(Duration::from_millis(timeout_ms));
        let gone = || self.client_gone(stream);
        match self.kv.wait_for(keys, deadline, want_values, &gone) {
            Ok(values) if want_values => Some(Response::List(values)),
            Ok(_) => Some(Response::Ok),
            Err(WaitError::Timeout(missing)) => Some(Response::Timeout(missing)),
            Err(WaitError::Aborted | WaitError::Interrupted) => None,
        }
    }

    fn handle(&self, stream: &TcpStream, req: Request) -> Option<Response> {
        let kv = &self.kv;
        Some(match req {
            Request::Hello => {
                *lock(&self.workers) += 1;
                self.workers_changed.notify_all();
                Response::Ok
            }
            Request::Set { key, value } => {
                kv.set(&key, &value);
                Response::Ok
            }
            Request::Get { keys, timeout_ms } => return self.wait(stream, &keys, timeout_ms, true),
            Request::Add { key, delta } => match kv.add(&key, delta) {
                Ok(v) => Response::Int(v),
                Err(e) => Response::Error(e.to_string()),
            },
            Request::Append { key, value } => {
                kv.append(&key, &value);
                Response::Ok
            }
            Request::Check { keys } => Response::Bool(kv.check(&keys)),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => Response::Bytes(kv.compare_set(&key, &expected, &desired)),
            Request::Delete { key } => Response::Bool(kv.delete_key(&key)),
            Request::MultiSet { keys, values } => {
                if keys.len() != values.len() {
                    return None;
                }
                kv.multi_set(&keys, &values);
                Response::Ok
            }
            Request::NumKeys => Response::Int(kv.num_keys()),
            Request::Wait { keys, timeout_ms } => {
                return self.wait(stream, &keys, timeout_ms, false)
            }
            // Authentication belongs at the start of a connection, and only with a key.
            Request::AuthInit { .. } if self.key.is_none() => Response::AuthFailed(
                "RUSTDIST_AUTH_KEY is set on this client but not on the TCPStore server".into(),
            ),
            Request::AuthInit { .. } | Request::AuthProof { .. } => return None,
        })
    }
}
