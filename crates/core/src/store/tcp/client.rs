//! The TCP store client: one connection, one request at a time. Every exchange has a deadline
//! that bounds each socket read and write, so a frozen or vanished server cannot hang a call.
//! With TLS every new connection shakes hands first; with an auth key it then authenticates
//! both ways (bound to the TLS session) before its first request.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use rustls::{ClientConfig, ClientConnection};

use super::protocol::{read_frame, Request, Response, MAX_AUTH_FRAME, MAX_FRAME};
use super::shared::{CLIENT_LABEL, EXPORTER_LABEL, LIMIT_REFUSAL, SERVER_LABEL};
use crate::auth::{self, AuthKey};
use crate::error::{Error, Result};
use crate::interrupt;
use crate::netio::{timed_out, DeadlineIo};
use crate::store::{deadline_after, wait_timeout_error};
use crate::tls::{self, Tls};

/// One connection to the server: its socket, and the TLS session on it when TLS is on.
struct Conn {
    sock: TcpStream,
    tls: Option<ClientConnection>,
}

impl Conn {
    /// Sends `req` and reads one answer frame of at most `max` bytes, within `deadline`
    /// (`interrupted` tells a Ctrl-C from a failure).
    fn exchange(
        &mut self,
        req: &Request,
        max: usize,
        deadline: Instant,
        interrupted: &mut bool,
    ) -> io::Result<Vec<u8>> {
        let mut io = DeadlineIo::new(&mut self.sock, deadline);
        let answer = match &mut self.tls {
            Some(tls) => roundtrip(&mut rustls::Stream::new(tls, &mut io), req, max),
            None => roundtrip(&mut io, req, max),
        };
        *interrupted = io.interrupted;
        answer
    }
}

fn roundtrip(rw: &mut (impl Read + Write), req: &Request, max: usize) -> io::Result<Vec<u8>> {
    rw.write_all(&req.encode())?;
    rw.flush()?;
    read_frame(rw, max)?.ok_or_else(|| io::ErrorKind::UnexpectedEof.into())
}

/// How much longer than its wait a blocking request may take before the client gives up on
/// the server's answer (the server answers "timeout" at the wait's end).
const GRACE: Duration = Duration::from_secs(2);
/// Longest pause between two connection attempts.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Pause before joining again after the server reached went away during the handshake.
const REJOIN_PAUSE: Duration = Duration::from_millis(20);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Idle connections kept for reuse; more exist only while that many calls run at once.
const MAX_IDLE: usize = 4;

/// A store client. Calls from several threads run concurrently, each on its own connection
/// (a thread blocked in `get` does not hold up another's `set`); connections are reused.
pub struct Client {
    host: String,
    port: u16,
    /// Connections between calls. A failed exchange drops its connection (it may be
    /// mid-frame); the next call opens a new one.
    idle: Mutex<Vec<Conn>>,
    timeout: Mutex<Duration>,
    key: Option<AuthKey>,
    tls: Option<Arc<ClientConfig>>,
}

impl Client {
    /// Connects (retrying until `timeout`, since the server may start later) and announces
    /// itself to the server, over TLS with `tls`. A failed TLS handshake or authentication
    /// fails at once (`Error::Network`).
    pub fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
        key: Option<AuthKey>,
        tls: Option<&Tls>,
    ) -> Result<Self> {
        // The server's chain is checked against the CA; with pinned keys any certificate
        // does, the key's proofs being bound to the session.
        let tls = tls.map(|t| t.client_config(None)).transpose()?;
        let client = Client {
            host: host.to_owned(),
            port,
            idle: Mutex::new(Vec::new()),
            timeout: Mutex::new(timeout),
            key,
            tls,
        };
        let deadline = deadline_after(timeout);
        loop {
            // The server reached may be one that is shutting down (a process group being
            // re-created on the same port): until the deadline, try again.
            let hello = client.dial(deadline).and_then(|conn| {
                lock(&client.idle).push(conn);
                checked(client.call(&Request::Hello, None)?)
            });
            match hello {
                Ok(Response::Ok) => return Ok(client),
                Ok(other) => return Err(unexpected(other)),
                // Interrupted, refused authentication, or the deadline passed while dialling.
                Err(e @ (Error::Interrupted | Error::Network(_))) => return Err(e),
                Err(_) if Instant::now() + REJOIN_PAUSE < deadline => {
                    lock(&client.idle).clear();
                    thread::sleep(REJOIN_PAUSE);
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn timeout(&self) -> Duration {
        *lock(&self.timeout)
    }

    pub fn set_timeout(&self, timeout: Duration) {
        *lock(&self.timeout) = timeout;
    }

    /// Opens a connection (see [`Client::open`]), shakes hands and authenticates.
    fn dial(&self, deadline: Instant) -> Result<Conn> {
        let mut conn = Conn {
            sock: self.open(deadline)?,
            tls: None,
        };
        if let Some(config) = &self.tls {
            let name = rustls::pki_types::ServerName::try_from("rustdist")
                .map_err(|e| Error::invalid(e.to_string()))?;
            let mut tls = ClientConnection::new(config.clone(), name)
                .map_err(|e| self.tls_failed(&e.to_string()))?;
            let mut io = DeadlineIo::new(&mut conn.sock, deadline);
            while tls.is_handshaking() {
                if let Err(e) = tls.complete_io(&mut io) {
                    if io.interrupted {
                        return Err(Error::Interrupted);
                    }
                    return Err(self.tls_failed(&tls::describe_io(&e)));
                }
            }
            conn.tls = Some(tls);
        }
        if let Some(key) = &self.key {
            self.authenticate(key, &mut conn, deadline)?;
        }
        Ok(conn)
    }

    /// The client's side of the exchange in [`crate::auth`]: its nonce, the server's proof
    /// checked, its own proof, both over the TLS session's exporter when there is one. Any
    /// failure is `Error::Network` saying "authentication failed".
    fn authenticate(&self, key: &AuthKey, conn: &mut Conn, deadline: Instant) -> Result<()> {
        let failed = |why: String| self.auth_failed(&why);
        let binding = match &conn.tls {
            Some(tls) => tls
                .export_keying_material([0u8; 32], EXPORTER_LABEL, None)
                .map_err(|e| failed(e.to_string()))?
                .to_vec(),
            None => Vec::new(),
        };
        let mut exchange = |req: Request| -> Result<Response> {
            let mut interrupted = false;
            let frame = conn.exchange(&req, MAX_AUTH_FRAME, deadline, &mut interrupted);
            if interrupted {
                return Err(Error::Interrupted);
            }
            let frame =
                frame.map_err(|e| failed(format!("{e} (is RUSTDIST_AUTH_KEY set alike?)")))?;
            Response::decode(&frame).map_err(|e| failed(e.to_string()))
        };
        let client_nonce = auth::nonce()?;
        let (nonce, tag) = match exchange(Request::AuthInit {
            nonce: client_nonce,
        })? {
            Response::Challenge { nonce, tag } => (nonce, tag),
            Response::AuthFailed(msg) => return Err(failed(msg)),
            Response::Error(msg) => return Err(self.refused(&msg)),
            _ => {
                return Err(failed(
                    "the server does not speak rustdist's protocol".into(),
                ))
            }
        };
        // Our proof goes out even when the server's fails, so that the server logs the refusal.
        let parts: [&[u8]; 3] = [&client_nonce, &nonce, &binding];
        let server_ok = key.verify(SERVER_LABEL, &parts, &tag);
        let proof = key.tag(CLIENT_LABEL, &parts);
        let answer = exchange(Request::AuthProof { tag: proof });
        if !server_ok {
            return Err(failed(
                "the server's RUSTDIST_AUTH_KEY differs from this client's".into(),
            ));
        }
        match answer? {
            Response::Ok => Ok(()),
            Response::AuthFailed(msg) => Err(failed(msg)),
            _ => Err(failed("unexpected answer".into())),
        }
    }

    fn tls_failed(&self, why: &str) -> Error {
        Error::network(format!(
            "TCPStore: the TLS handshake with the server at ({}, {}) failed: {why}",
            self.host, self.port
        ))
    }

    fn auth_failed(&self, why: &str) -> Error {
        Error::network(format!(
            "TCPStore: authentication failed with the server at ({}, {}): {why}",
            self.host, self.port
        ))
    }

    /// The server turned this connection away (over its connection cap): fails at once,
    /// with the server's reason, which says how to raise the cap.
    fn refused(&self, why: &str) -> Error {
        Error::network(format!(
            "TCPStore: the server at ({}, {}) refused this client: {why}",
            self.host, self.port
        ))
    }

    /// Opens a connection, retrying with backoff until `deadline` (torch's error type for a
    /// server that never answers: DistNetworkError).
    fn open(&self, deadline: Instant) -> Result<TcpStream> {
        let mut pause = Duration::from_millis(10);
        let started = Instant::now();
        loop {
            let last_err = match (self.host.as_str(), self.port).to_socket_addrs() {
                Ok(addrs) => {
                    let mut last = io::Error::from(io::ErrorKind::AddrNotAvailable);
                    for addr in addrs {
                        let left = deadline.saturating_duration_since(Instant::now());
                        let attempt = left
                            .min(Duration::from_secs(5))
                            .max(Duration::from_millis(1));
                        match TcpStream::connect_timeout(&addr, attempt) {
                            Ok(stream) => {
                                // Nagle would delay each small request by a round trip.
                                let _ = stream.set_nodelay(true);
                                return Ok(stream);
                            }
                            Err(e) => last = e,
                        }
                    }
                    last
                }
                Err(e) => e,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::network(format!(
                    "TCPStore client timed out after {}ms while trying to connect to ({}, {}): {last_err}",
                    (now - started).as_millis(),
                    self.host,
                    self.port
                )));
            }
            interrupt::sleep(pause.min(deadline - now))?;
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }

    /// Sends `req` and returns the response. `wait` is the server-side wait of a blocking
    /// request; the exchange must finish within `wait + GRACE`, or the store's timeout for
    /// the others.
    pub fn call(&self, req: &Request, wait: Option<Duration>) -> Result<Response> {
        let budget = match wait {
            Some(w) => w.saturating_add(GRACE),
            None => self.timeout(),
        };
        let deadline = deadline_after(budget);
        let idle = lock(&self.idle).pop();
        let mut conn = match idle {
            Some(c) => c,
            None => self
                .dial(deadline)
                .map_err(|e| Error::store(e.to_string()))?,
        };
        let mut interrupted = false;
        let exchanged = conn.exchange(req, MAX_FRAME, deadline, &mut interrupted);
        // An interrupted exchange drops its connection: the answer may still come.
        if interrupted {
            return Err(Error::Interrupted);
        }
        let decoded = match exchanged.map(|frame| Response::decode(&frame)) {
            // The server closes a connection it refused: it does not go back to the pool.
            Ok(Ok(Response::AuthFailed(why))) => return Err(self.auth_failed(&why)),
            Ok(Ok(Response::Error(why))) if why.starts_with(LIMIT_REFUSAL) => {
                return Err(self.refused(&why))
            }
            Ok(decoded) => decoded,
            Err(e) if timed_out(&e) => Err(Error::store(format!(
                "TCPStore: no answer from the server at ({}, {}) within {}ms",
                self.host,
                self.port,
                budget.as_millis()
            ))),
            Err(e) => Err(Error::store(format!(
                "TCPStore: connection to the server at ({}, {}) failed: {e}",
                self.host, self.port
            ))),
        };
        if decoded.is_ok() {
            let mut idle = lock(&self.idle);
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        decoded
    }
}

/// Turns the answer to a blocking request into its values, or the timeout error.
pub fn waited(resp: Response, timeout: Duration) -> Result<Response> {
    match resp {
        Response::Timeout(missing) => Err(wait_timeout_error(&missing, timeout)),
        other => checked(other),
    }
}

/// Turns a server-reported error into a Store error.
pub fn checked(resp: Response) -> Result<Response> {
    match resp {
        Response::Error(msg) => Err(Error::Store(msg)),
        other => Ok(other),
    }
}

/// A well-formed response of the wrong kind for the request.
pub fn unexpected(_: Response) -> Error {
    Error::store("TCPStore: the server answered with the wrong kind of response")
}
