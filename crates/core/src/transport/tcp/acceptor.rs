//! The accepting side of connection setup: incoming connections progress through their
//! handshakes concurrently on a non-blocking listener, each checked against this rank's view of
//! the group, until every expected peer and stream is connected. Kept apart from the connecting
//! side because this is where hostile input arrives, and its bounds (pending handshakes, their
//! time) live here.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::handshake::{Hello, Reply, Status, ACCEPTOR_LABEL, CONNECTOR_LABEL, HELLO_LEN};
use super::poll::{poll_fds, pollfd};
use super::socket::configure;
use crate::auth::{self, AuthKey, Nonce, TAG_LEN};
use crate::error::{Error, Result};
use crate::interrupt;
use crate::timeout::remaining;

/// Incoming connections in mid-handshake at once; the rest wait in the listen backlog (sized
/// from `somaxconn`) until a handshake finishes, so a flood cannot grow memory and no peer is
/// dropped for being one of many.
const MAX_PENDING: usize = 64;
/// How long an incoming connection may take to finish its handshake.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
pub(super) struct Slot {
    pub(super) peer: usize,
    pub(super) stream: usize,
}

/// Who may connect, decided for each hello that names this job, group and world: a refusal
/// (at the hello, and again after the proof, atomically with taking the connection), and
/// where an admitted connection goes.
pub(super) trait Admission {
    /// Why a connection claiming `slot` is refused (an empty reason is an expected refusal,
    /// not logged); None admits it.
    fn refusal(&self, slot: Slot) -> Option<(Status, String)>;
    /// Takes the connection admitted into `slot` (configured, its reply sent).
    fn admit(&mut self, slot: Slot, sock: TcpStream);
}

/// The connections an accepting rank expects, by peer and stream: `slots[peer][stream]`, filled
/// as they come. A peer's first `first_stream` entries are not expected here (rank 0 of a
/// peer's streams is its first connection, made before the extra ones).
pub(super) struct Slots {
    pub(super) socks: Vec<Vec<Option<TcpStream>>>,
    pub(super) first_stream: usize,
    /// By peer, for the peers linked on first use (None for the others): the streams of the
    /// links they made to this rank while it was still connecting (they had finished and
    /// needed it), in order, kept for [`super::OnDemand`].
    pub(super) early: Vec<Option<Vec<TcpStream>>>,
}

impl Slots {
    fn expects(&self, peer: usize, stream: usize) -> bool {
        stream >= self.first_stream && self.socks.get(peer).is_some_and(|s| stream < s.len())
    }

    fn taken(&self, slot: Slot) -> bool {
        self.socks[slot.peer][slot.stream].is_some()
    }

    /// Connections still expected.
    fn missing_count(&self) -> usize {
        self.missing().count()
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

impl Admission for Slots {
    fn refusal(&self, slot: Slot) -> Option<(Status, String)> {
        let Slot { peer, stream } = slot;
        let early = self.early.get(peer).and_then(Option::as_ref);
        if early.is_some_and(|got| got.len() == stream) {
            None
        } else if !self.expects(peer, stream) {
            Some((
                Status::BadRank,
                format!(
                    "rank {peer} offers stream {stream}, which this rank does not expect from it"
                ),
            ))
        } else if self.taken(slot) {
            Some((
                Status::Duplicate,
                format!("a second connection claims rank {peer} (stream {stream}), which is already connected"),
            ))
        } else {
            None
        }
    }

    fn admit(&mut self, slot: Slot, sock: TcpStream) {
        match self.early.get_mut(slot.peer).and_then(Option::as_mut) {
            Some(early) => early.push(sock),
            None => self.socks[slot.peer][slot.stream] = Some(sock),
        }
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
pub(super) struct Acceptor<'a> {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) group: u32,
    pub(super) job: u64,
    pub(super) key: Option<&'a AuthKey>,
}

impl Acceptor<'_> {
    /// Reads what `inc` sent and moves its handshake on; `adm` decides who may connect.
    fn step(&self, inc: &mut Incoming, adm: &dyn Admission) -> Step {
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
            None => self.on_hello(inc, adm),
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
                self.admit(inc, slot, adm)
            }
        }
    }

    /// What in `hello` disagrees with this rank's view of the group, if anything.
    fn mismatch(&self, hello: &Hello, adm: &dyn Admission) -> Option<(Status, String)> {
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
        } else if hello.rank == rank || hello.rank >= size {
            let claimed = hello.rank;
            (
                Status::BadRank,
                format!("it claims rank {claimed}, which does not connect to rank {rank}"),
            )
        } else {
            return adm.refusal(Slot {
                peer: hello.rank as usize,
                stream: hello.stream as usize,
            });
        })
    }

    fn on_hello(&self, inc: &mut Incoming, adm: &dyn Admission) -> Step {
        let Some(hello) = Hello::decode(&inc.buf) else {
            return Step::Dropped("not a rustdist peer (wrong magic or version)".into());
        };
        if let Some((status, why)) = self.mismatch(&hello, adm) {
            return refuse(inc, status, why);
        }
        let slot = Slot {
            peer: hello.rank as usize,
            stream: hello.stream as usize,
        };
        let peer = slot.peer;
        match (self.key, hello.auth) {
            (None, false) => self.admit(inc, slot, adm),
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

    /// Connects `slot` unless `adm` refuses it now (another connection took it meanwhile).
    fn admit(&self, inc: &mut Incoming, slot: Slot, adm: &dyn Admission) -> Step {
        if let Some((status, why)) = adm.refusal(slot) {
            return refuse(inc, status, why);
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

/// The incoming connections of one listener in mid-handshake.
#[derive(Default)]
pub(super) struct Accepting {
    pending: Vec<Incoming>,
}

impl Accepting {
    /// One round that does not wait: takes new connections from `listener` while fewer than
    /// [`MAX_PENDING`] are in mid-handshake, moves every handshake on, and hands each one
    /// `adm` admits to it. Returns how many were admitted.
    pub(super) fn serve(
        &mut self,
        listener: &TcpListener,
        acceptor: &Acceptor<'_>,
        adm: &mut dyn Admission,
    ) -> usize {
        let rank = acceptor.rank;
        while self.pending.len() < MAX_PENDING {
            match listener.accept() {
                Ok((sock, from)) => {
                    if sock.set_nonblocking(true).is_err() {
                        continue;
                    }
                    self.pending.push(Incoming {
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
        let mut admitted = 0;
        let mut i = 0;
        while i < self.pending.len() {
            let step = if self.pending[i].since.elapsed() > HANDSHAKE_TIMEOUT {
                Step::Dropped("it did not finish the handshake in time".into())
            } else {
                acceptor.step(&mut self.pending[i], adm)
            };
            match step {
                Step::Pending => i += 1,
                Step::Done(slot) => {
                    let inc = self.pending.swap_remove(i);
                    match configure(&inc.sock) {
                        Ok(()) => {
                            adm.admit(slot, inc.sock);
                            admitted += 1;
                        }
                        Err(e) => log::warn!("rank {rank}: dropped {}: {e}", inc.from),
                    }
                }
                Step::Dropped(why) => {
                    let inc = self.pending.swap_remove(i);
                    // No reason: an expected refusal (two ranks dialled each other at once).
                    if !why.is_empty() {
                        log::warn!("rank {rank}: dropped a connection from {}: {why}", inc.from);
                    }
                }
            }
        }
        admitted
    }

    /// What poll(2) waits on for the next round: `listener` while there is room, and every
    /// handshake in progress.
    pub(super) fn pollfds(&self, listener: &TcpListener) -> Vec<libc::pollfd> {
        // A full house leaves the listener out: what waits there waits for a free place.
        let listening = (self.pending.len() < MAX_PENDING).then(|| listener.as_raw_fd());
        listening
            .into_iter()
            .chain(self.pending.iter().map(|p| p.sock.as_raw_fd()))
            .map(|fd| pollfd(fd, libc::POLLIN))
            .collect()
    }
}

/// Accepts the connections `slots` expects on `listener` until all are connected or
/// `deadline` passes. Handshakes still in progress then stay in `accepting` for whoever
/// serves the listener next.
pub(super) fn accept_peers(
    listener: &TcpListener,
    accepting: &mut Accepting,
    acceptor: &Acceptor<'_>,
    slots: &mut Slots,
    deadline: Instant,
) -> Result<()> {
    let rank = acceptor.rank;
    loop {
        // Counted again: a link made early (`Slots::early`) is admitted but not expected.
        accepting.serve(listener, acceptor, slots);
        if slots.missing_count() == 0 {
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
        let mut fds = accepting.pollfds(listener);
        poll_fds(
            &mut fds,
            interrupt::slice(left.min(Duration::from_millis(100))),
        );
        interrupt::check()?;
    }
    Ok(())
}
