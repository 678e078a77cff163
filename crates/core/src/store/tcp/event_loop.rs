//! The store server's event loop (see [`super::server`] for the design): accepting, reading,
//! the authentication exchange, requests, parked waits and every timer run on one thread.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::io;
use std::net::{Shutdown, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::event::Event;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use super::conn::{Conn, Phase, ReadOutcome, Wire, CHUNK};
use super::protocol::{Request, Response};
use super::shared::{lock, Shared, AUTH_TIMEOUT, CLIENT_LABEL, SERVER_LABEL};
use crate::auth::{self, AuthKey};
use crate::store::deadline_after;
use crate::store::hash::{MemKv, WaitError};
use crate::tls::TlsStream;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// Token of the connection in slot 0.
const FIRST_CONN: usize = 2;
/// Connections being refused at once; past that, new ones wait in the backlog.
const MAX_REFUSING: usize = 64;
/// Chunks one connection may read per turn, so that one busy client cannot starve the rest.
const READ_BUDGET: usize = 16;
/// Pause before accepting again after the process ran out of fds or memory.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// Longest sleep of the loop (a safety net should a wake-up be lost).
const MAX_POLL_WAIT: Duration = Duration::from_secs(1);
const NO_AUTH_KEY: &str =
    "this TCPStore server requires RUSTDIST_AUTH_KEY, and the client did not authenticate";
const WRONG_AUTH_KEY: &str = "the client's RUSTDIST_AUTH_KEY differs from the TCPStore server's";
const TLS_REQUIRED: &str = "this TCPStore server requires TLS (RUSTDIST_TLS or RUSTDIST_TLS_CERT \
                            is set there), and the client does not use it";
/// A TLS alert record (fatal, handshake_failure): a TLS client's answer from a server without
/// TLS, which it reports as such.
const TLS_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// A parked request's deadline.
    Waiter(u64),
    /// A connection's authentication, refusal or write deadline.
    Conn { slot: usize, serial: u64 },
    /// Accepting again after running out of fds.
    Accept,
}

/// A blocking request waiting for its keys.
struct Parked {
    slot: usize,
    keys: Vec<String>,
    want_values: bool,
}

/// What a request comes to.
enum Outcome {
    Reply(Response),
    /// Answer, then wake the waiters of these written keys.
    Wrote(Response, Vec<String>),
    Park {
        keys: Vec<String>,
        timeout_ms: u64,
        want_values: bool,
    },
    Close,
}

pub(crate) struct EventLoop {
    poll: Poll,
    listener: mio::net::TcpListener,
    key: Option<AuthKey>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shared: Arc<Shared>,
    kv: MemKv,
    max_clients: usize,
    /// The encoded refusal for clients over `max_clients`.
    refusal: Vec<u8>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    served: usize,
    refusing: usize,
    refused_total: u64,
    next_serial: u64,
    paused_for_refusals: bool,
    parked: HashMap<u64, Parked>,
    /// The parked requests that wait for each key.
    by_key: HashMap<String, HashSet<u64>>,
    next_waiter: u64,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// Connections to serve again without a new event (woken, or over their read budget).
    run_queue: VecDeque<usize>,
    scratch: Vec<u8>,
}

/// A `WaitError` cannot be `Aborted` or `Interrupted` for a wait that never blocks.
fn missing_of(e: WaitError) -> Vec<String> {
    match e {
        WaitError::Timeout(missing) => missing,
        WaitError::Aborted | WaitError::Interrupted => Vec::new(),
    }
}

impl EventLoop {
    pub fn new(
        listener: TcpListener,
        key: Option<AuthKey>,
        tls: Option<Arc<rustls::ServerConfig>>,
        shared: Arc<Shared>,
        max_clients: usize,
        refusal: String,
    ) -> io::Result<(Self, Arc<Waker>)> {
        let poll = Poll::new()?;
        let mut listener = mio::net::TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let event_loop = EventLoop {
            poll,
            listener,
            key,
            tls,
            shared,
            kv: MemKv::default(),
            max_clients,
            refusal: Response::Error(refusal).encode(),
            conns: Vec::new(),
            free: Vec::new(),
            served: 0,
            refusing: 0,
            refused_total: 0,
            next_serial: 0,
            paused_for_refusals: false,
            parked: HashMap::new(),
            by_key: HashMap::new(),
            next_waiter: 0,
            timers: BinaryHeap::new(),
            run_queue: VecDeque::new(),
            scratch: vec![0; CHUNK],
        };
        Ok((event_loop, waker))
    }

    /// Serves until the server is dropped, then closes every socket.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        while !self.shared.stopping() {
            let timeout = if self.run_queue.is_empty() {
                let next = self.timers.peek().map(|Reverse((at, _))| *at);
                let wait = next.map_or(MAX_POLL_WAIT, |at| {
                    at.saturating_duration_since(Instant::now())
                });
                wait.min(MAX_POLL_WAIT)
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("TCPStore server: the event loop failed: {e}; stopping");
                break;
            }
            if self.shared.stopping() {
                break;
            }
            for event in &events {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(t) => self.on_event(t - FIRST_CONN, event),
                }
            }
            self.fire_timers(Instant::now());
            for _ in 0..self.run_queue.len() {
                if let Some(slot) = self.run_queue.pop_front() {
                    self.drive(slot);
                }
            }
        }
        // Closing the sockets (with the listener, when `self` drops) hangs up on every client.
        self.conns.clear();
        self.shared.set_conns(0);
    }

    fn conn(&mut self, slot: usize) -> Option<&mut Conn> {
        self.conns.get_mut(slot).and_then(Option::as_mut)
    }

    fn open(&self) -> usize {
        self.served + self.refusing
    }

    fn accept(&mut self) {
        loop {
            if self.served >= self.max_clients && self.refusing >= MAX_REFUSING {
                // Resumed when a refusal ends; until then new clients wait in the backlog.
                self.paused_for_refusals = true;
                return;
            }
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    if let Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) =
                        e.raw_os_error()
                    {
                        // Edge-triggered: the pending connections raise no new event.
                        log::warn!("TCPStore server: cannot accept a client: {e}; retrying");
                        self.arm(Instant::now() + ACCEPT_RETRY, Timer::Accept);
                        return;
                    }
                    // Otherwise the connection failed before it was accepted (or EINTR).
                }
            }
        }
    }

    fn admit(&mut self, mut stream: TcpStream) {
        // Nagle would delay each small answer by a round trip.
        let _ = stream.set_nodelay(true);
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) =
            self.poll
                .registry()
                .register(&mut stream, Token(slot + FIRST_CONN), interest)
        {
            log::warn!("TCPStore server: cannot watch a new client: {e}");
            self.free.push(slot);
            return;
        }
        let wire = match &self.tls {
            None => Wire::Plain(stream),
            Some(config) => match TlsStream::server(stream, config.clone()) {
                Ok(tls) => Wire::Tls(Box::new(tls)),
                // Dropped: closing its fd takes it out of the poll.
                Err(e) => {
                    log::warn!("TCPStore server: cannot start TLS with a client: {e}");
                    self.free.push(slot);
                    return;
                }
            },
        };
        let now = Instant::now();
        let (phase, deadline) = if self.served >= self.max_clients {
            self.refusing += 1;
            self.refused_total += 1;
            if self.refused_total % 1000 == 1 {
                log::warn!(
                    "TCPStore server: refusing clients over the limit of {} ({} so far)",
                    self.max_clients,
                    self.refused_total
                );
            }
            (
                Phase::Refusing { answered: false },
                Some(now + AUTH_TIMEOUT),
            )
        } else {
            self.served += 1;
            match self.key {
                Some(_) => (Phase::AwaitInit, Some(now + AUTH_TIMEOUT)),
                None => (Phase::Serving, None),
            }
        };
        let serial = self.next_serial;
        self.next_serial += 1;
        if let Some(at) = deadline {
            self.arm(at, Timer::Conn { slot, serial });
        }
        self.conns[slot] = Some(Conn::new(wire, serial, phase, deadline));
        self.shared.set_conns(self.open());
    }

    fn close(&mut self, slot: usize) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let _ = self.poll.registry().deregister(conn.wire.socket_mut());
        if let Some(id) = conn.parked {
            self.unpark(id);
        }
        if matches!(conn.phase, Phase::Refusing { .. }) {
            self.refusing -= 1;
        } else {
            self.served -= 1;
        }
        drop(conn);
        self.free.push(slot);
        self.shared.set_conns(self.open());
        if self.paused_for_refusals {
            // Accepted from the loop, not here: a caller may still hold this slot's number.
            self.paused_for_refusals = false;
            self.arm(Instant::now(), Timer::Accept);
        }
    }

    fn arm(&mut self, at: Instant, timer: Timer) {
        self.timers.push(Reverse((at, timer)));
        // Timers of answered waits and closed connections linger until due: drop them when
        // they outnumber the live ones.
        if self.timers.len() > 1024 + 4 * (self.parked.len() + self.open()) {
            let live = std::mem::take(&mut self.timers)
                .into_iter()
                .filter(|Reverse((_, t))| self.timer_live(*t))
                .collect();
            self.timers = live;
        }
    }

    fn timer_live(&self, timer: Timer) -> bool {
        match timer {
            Timer::Waiter(id) => self.parked.contains_key(&id),
            Timer::Conn { slot, serial } => self
                .conns
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|c| c.serial == serial && c.deadline().is_some()),
            Timer::Accept => true,
        }
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(&Reverse((at, timer))) = self.timers.peek() {
            if at > now {
                return;
            }
            self.timers.pop();
            match timer {
                Timer::Waiter(id) => self.expire(id),
                Timer::Accept => self.accept(),
                Timer::Conn { slot, serial } => {
                    let Some(conn) = self.conn(slot).filter(|c| c.serial == serial) else {
                        continue;
                    };
                    match conn.deadline() {
                        Some(due) if due <= now => {
                            if matches!(conn.phase, Phase::AwaitInit | Phase::AwaitProof { .. }) {
                                let why = format!(
                                    "the client did not authenticate within {}s",
                                    AUTH_TIMEOUT.as_secs()
                                );
                                self.log_refusal(slot, &why);
                            }
                            self.close(slot);
                        }
                        // The deadline moved (a write made progress): look again then.
                        Some(due) => self.arm(due, timer),
                        None => {}
                    }
                }
            }
        }
    }

    fn on_event(&mut self, slot: usize, event: &Event) {
        let now = Instant::now();
        let Some(conn) = self.conn(slot) else {
            return;
        };
        if event.is_writable() && !conn.flushed() && conn.flush(now).is_err() {
            self.close(slot);
            return;
        }
        self.drive(slot);
    }

    /// Does what `slot` is ready for: finishes closing, notices a hang-up while parked, or
    /// handles buffered frames and reads more.
    fn drive(&mut self, slot: usize) {
        let mut budget = READ_BUDGET;
        loop {
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                return;
            };
            if let Phase::Refusing { answered } = conn.phase {
                return self.drive_refusing(slot, answered);
            }
            if conn.closing {
                if conn.flushed() {
                    self.close(slot);
                }
                return;
            }
            if conn.parked.is_some() {
                if conn.hung_up() {
                    self.close(slot);
                }
                return;
            }
            if !conn.ready() {
                return; // an answer is still being written: the writable event resumes it
            }
            if conn.speaks_tls() {
                conn.closing = true;
                let sent = conn.send(&TLS_ALERT, Instant::now());
                self.log_refusal(slot, "the client speaks TLS, this server has TLS off");
                if sent.is_err() || self.conn(slot).is_some_and(|c| c.flushed()) {
                    self.close(slot);
                }
                return;
            }
            match conn.next_frame() {
                Ok(Some(body)) => {
                    let end = body.end;
                    let req = Request::decode(conn.frame(body));
                    conn.consume(end);
                    self.handle_frame(slot, req);
                    continue;
                }
                Ok(None) => {}
                Err(e) => return self.fail(slot, &e.to_string()),
            }
            if budget == 0 {
                self.run_queue.push_back(slot);
                return;
            }
            budget -= 1;
            match conn.read_some(&mut self.scratch) {
                Ok(ReadOutcome::Data) => {}
                Ok(ReadOutcome::WouldBlock) => return,
                Ok(ReadOutcome::NotTls) => {
                    let refusal = Response::AuthFailed(TLS_REQUIRED.into()).encode();
                    conn.refuse_in_the_clear(&refusal, &mut self.scratch);
                    self.log_refusal(slot, TLS_REQUIRED);
                    return self.close(slot);
                }
                Ok(ReadOutcome::Eof) => {
                    let quiet = matches!(conn.phase, Phase::AwaitInit) && !conn.mid_frame();
                    if quiet {
                        // Left before saying anything (a probe, a client giving up).
                        return self.close(slot);
                    }
                    return self.fail(slot, "the client hung up during authentication");
                }
                Err(e) => return self.fail(slot, &e.to_string()),
            }
        }
    }

    /// Closes `slot` after a read failure, logging it when it happened during authentication.
    fn fail(&mut self, slot: usize, why: &str) {
        let authenticating = self
            .conn(slot)
            .is_some_and(|c| matches!(c.phase, Phase::AwaitInit | Phase::AwaitProof { .. }));
        if authenticating {
            self.log_refusal(slot, why);
        }
        self.close(slot);
    }

    fn log_refusal(&mut self, slot: usize, why: &str) {
        let from = self
            .conn(slot)
            .and_then(|c| c.wire.socket().peer_addr().ok())
            .map_or("?".into(), |a| a.to_string());
        log::warn!("TCPStore: refused a client from {from}: authentication failed: {why}");
    }

    /// A client over the cap: its first bytes get the refusal, then its side is read and
    /// discarded until it hangs up (closing with unread bytes would reset the connection and
    /// could destroy the refusal before the client reads it).
    fn drive_refusing(&mut self, slot: usize, mut answered: bool) {
        let now = Instant::now();
        for _ in 0..READ_BUDGET {
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                return;
            };
            let outcome = conn.read_some(&mut self.scratch);
            if matches!(outcome, Ok(ReadOutcome::Data)) && !answered {
                answered = true;
                conn.phase = Phase::Refusing { answered };
                // Its deadline (AUTH_TIMEOUT) bounds the write too.
                if conn.send(&self.refusal, now).is_err() {
                    return self.close(slot);
                }
            }
            if answered && conn.flushed() {
                let _ = conn.wire.socket().shutdown(Shutdown::Write);
            }
            match outcome {
                Ok(ReadOutcome::Data) => {}
                Ok(ReadOutcome::WouldBlock) => return,
                Ok(ReadOutcome::Eof | ReadOutcome::NotTls) | Err(_) => return self.close(slot),
            }
        }
        self.run_queue.push_back(slot);
    }

    /// Queues `resp` on `slot`; closes it when the socket failed.
    fn send(&mut self, slot: usize, resp: &Response) {
        let Some(conn) = self.conn(slot) else {
            return;
        };
        match conn.send(&resp.encode(), Instant::now()) {
            Ok(false) => {}
            Ok(true) => {
                let (serial, due) = (conn.serial, conn.deadline());
                if let Some(at) = due {
                    self.arm(at, Timer::Conn { slot, serial });
                }
            }
            Err(_) => self.close(slot),
        }
    }

    fn handle_frame(&mut self, slot: usize, req: crate::error::Result<Request>) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        match (&conn.phase, self.key.as_ref(), req) {
            (
                Phase::AwaitInit,
                Some(key),
                Ok(Request::AuthInit {
                    nonce: client_nonce,
                }),
            ) => {
                let nonce = match auth::nonce() {
                    Ok(n) => n,
                    Err(e) => return self.fail(slot, &e.to_string()),
                };
                let binding = match conn.wire.binding() {
                    Ok(b) => b,
                    Err(e) => return self.fail(slot, &e.to_string()),
                };
                let tag = key.tag(SERVER_LABEL, &[&client_nonce, &nonce, &binding]);
                conn.phase = Phase::AwaitProof {
                    client_nonce,
                    nonce,
                };
                self.send(slot, &Response::Challenge { nonce, tag });
            }
            (Phase::AwaitInit, _, _) => self.refuse(slot, NO_AUTH_KEY),
            (
                Phase::AwaitProof {
                    client_nonce,
                    nonce,
                },
                Some(key),
                Ok(Request::AuthProof { tag }),
            ) if conn.wire.binding().is_ok_and(|binding| {
                key.verify(CLIENT_LABEL, &[client_nonce, nonce, &binding], &tag)
            }) =>
            {
                conn.phase = Phase::Serving;
                conn.phase_deadline = None;
                self.send(slot, &Response::Ok);
            }
            (Phase::AwaitProof { .. }, _, _) => self.refuse(slot, WRONG_AUTH_KEY),
            (Phase::Serving, _, Ok(req)) => self.serve(slot, req),
            (Phase::Serving | Phase::Refusing { .. }, _, Err(_)) | (Phase::Refusing { .. }, ..) => {
                self.close(slot)
            }
        }
    }

    /// Tells an unauthenticated client why it is refused, then closes it.
    fn refuse(&mut self, slot: usize, why: &str) {
        self.log_refusal(slot, why);
        self.send(slot, &Response::AuthFailed(why.to_owned()));
        if let Some(conn) = self.conn(slot) {
            conn.closing = true;
            if conn.flushed() {
                self.close(slot);
            }
        }
    }

    fn serve(&mut self, slot: usize, req: Request) {
        match self.outcome(req) {
            Outcome::Reply(resp) => self.send(slot, &resp),
            Outcome::Wrote(resp, keys) => {
                self.send(slot, &resp);
                for key in &keys {
                    self.wake(key);
                }
            }
            Outcome::Park {
                keys,
                timeout_ms,
                want_values,
            } => self.park(slot, keys, timeout_ms, want_values),
            Outcome::Close => self.close(slot),
        }
    }

    fn outcome(&mut self, req: Request) -> Outcome {
        let kv = &self.kv;
        match req {
            Request::Hello => {
                *lock(&self.shared.workers) += 1;
                self.shared.workers_changed.notify_all();
                Outcome::Reply(Response::Ok)
            }
            Request::Set { key, value } => {
                kv.set(&key, &value);
                Outcome::Wrote(Response::Ok, vec![key])
            }
            Request::Get { keys, timeout_ms } => Outcome::Park {
                keys,
                timeout_ms,
                want_values: true,
            },
            Request::Add { key, delta } => match kv.add(&key, delta) {
                Ok(v) => Outcome::Wrote(Response::Int(v), vec![key]),
                Err(e) => Outcome::Reply(Response::Error(e.to_string())),
            },
            Request::Append { key, value } => {
                kv.append(&key, &value);
                Outcome::Wrote(Response::Ok, vec![key])
            }
            Request::Check { keys } => Outcome::Reply(Response::Bool(kv.check(&keys))),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                let now = kv.compare_set(&key, &expected, &desired);
                Outcome::Wrote(Response::Bytes(now), vec![key])
            }
            Request::Delete { key } => Outcome::Reply(Response::Bool(kv.delete_key(&key))),
            Request::MultiSet { keys, values } => {
                if keys.len() != values.len() {
                    return Outcome::Close;
                }
                kv.multi_set(&keys, &values);
                Outcome::Wrote(Response::Ok, keys)
            }
            Request::NumKeys => Outcome::Reply(Response::Int(kv.num_keys())),
            Request::Wait { keys, timeout_ms } => Outcome::Park {
                keys,
                timeout_ms,
                want_values: false,
            },
            // Authentication belongs at the start of a connection, and only with a key.
            Request::AuthInit { .. } if self.key.is_none() => Outcome::Reply(Response::AuthFailed(
                "RUSTDIST_AUTH_KEY is set on this client but not on the TCPStore server".into(),
            )),
            Request::AuthInit { .. } | Request::AuthProof { .. } => Outcome::Close,
        }
    }

    /// The answer to a wait for `keys` if they all exist now; else the keys missing.
    fn lookup(&self, keys: &[String], want_values: bool) -> Result<Response, Vec<String>> {
        // A deadline already past: `wait_for` checks once and never blocks.
        match self
            .kv
            .wait_for(keys, Instant::now(), want_values, &|| false)
        {
            Ok(values) if want_values => Ok(Response::List(values)),
            Ok(_) => Ok(Response::Ok),
            Err(e) => Err(missing_of(e)),
        }
    }

    /// Answers a blocking request now, or parks it until its keys exist or its deadline.
    fn park(&mut self, slot: usize, keys: Vec<String>, timeout_ms: u64, want_values: bool) {
        let missing = match self.lookup(&keys, want_values) {
            Ok(resp) => return self.send(slot, &resp),
            Err(missing) => missing,
        };
        if timeout_ms == 0 {
            return self.send(slot, &Response::Timeout(missing));
        }
        let id = self.next_waiter;
        self.next_waiter += 1;
        for key in &keys {
            self.by_key.entry(key.clone()).or_default().insert(id);
        }
        self.parked.insert(
            id,
            Parked {
                slot,
                keys,
                want_values,
            },
        );
        if let Some(conn) = self.conn(slot) {
            conn.parked = Some(id);
        }
        let deadline = deadline_after(Duration::from_millis(timeout_ms));
        self.arm(deadline, Timer::Waiter(id));
    }

    /// Removes a parked request from the tables; its connection is no longer parked.
    fn unpark(&mut self, id: u64) -> Option<Parked> {
        let parked = self.parked.remove(&id)?;
        for key in &parked.keys {
            if let Some(ids) = self.by_key.get_mut(key) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        if let Some(conn) = self.conn(parked.slot) {
            if conn.parked == Some(id) {
                conn.parked = None;
            }
        }
        Some(parked)
    }

    /// Answers a parked request and lets its connection go on with what it sent next.
    fn answer(&mut self, id: u64, resp: &Response) {
        if let Some(parked) = self.unpark(id) {
            self.send(parked.slot, resp);
            self.run_queue.push_back(parked.slot);
        }
    }

    /// `key` was written: answers the parked requests it completes.
    fn wake(&mut self, key: &str) {
        let Some(ids) = self.by_key.remove(key) else {
            return;
        };
        let mut still = HashSet::new();
        for id in ids {
            let Some(parked) = self.parked.get(&id) else {
                continue;
            };
            match self.lookup(&parked.keys, parked.want_values) {
                Ok(resp) => self.answer(id, &resp),
                Err(_) => {
                    still.insert(id);
                }
            }
        }
        if !still.is_empty() {
            self.by_key.insert(key.to_owned(), still);
        }
    }

    /// A parked request's deadline passed: "timeout", with the keys still missing.
    fn expire(&mut self, id: u64) {
        let Some(parked) = self.parked.get(&id) else {
            return;
        };
        let resp = match self.lookup(&parked.keys, parked.want_values) {
            Ok(resp) => resp,
            Err(missing) => Response::Timeout(missing),
        };
        self.answer(id, &resp);
    }
}
