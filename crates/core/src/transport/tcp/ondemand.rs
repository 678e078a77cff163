//! Links made on first use. After connect a rank keeps its listener and every peer's
//! address; the first operation that needs a peer it has no link to dials it, and a thread of
//! the group accepts the peers that dial this rank, at any time (so a dial never waits for
//! what the other rank is doing). A rank's sockets then grow with the peers it talks to, not
//! with the world.
//!
//! Either rank of a pair may dial first. When both dial at once each acceptor sees its own
//! dial in flight and admits the other's only if it comes from the lower rank; the higher
//! rank's dial is refused (`Duplicate`) and it takes the lower rank's connection instead. The
//! state of each peer's link sits under one lock shared by the dialling mesh and the
//! accepting thread, so the two can never both keep a connection.
//!
//! A link's own setup after the connections (a TLS handshake, [`LinkSetup`]) is finished by the
//! accepting thread for the links peers make to this rank: the dialling peer's first frames
//! then go through while this rank is busy outside the group, as they do over plain TCP.

use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::SockRef;

use super::acceptor::{Accepting, Acceptor, Admission, Slot, HANDSHAKE_TIMEOUT};
use super::connect::{dial_once, refused, DialEnd, Dialled, Mesh};
use super::handshake::{Hello, Status};
use super::poll::poll_fds;
use crate::auth::{AuthKey, NONCE_LEN};
use crate::error::{Error, Result};
use crate::timeout::remaining;
use crate::wake::Wake;

/// What a peer's streams become (the mesh's link) and what setup that link needs after the
/// connections (a TLS handshake), which the accepting thread finishes for the links peers make
/// to this rank.
pub trait LinkSetup: Send + 'static {
    type Link: Send + 'static;
    /// `socks`, the streams to `peer` (the first first), as a link, its setup begun.
    fn start(&self, peer: usize, socks: Vec<TcpStream>) -> Result<Self::Link>;
    /// Moves the setup of `peer`'s link on without waiting; true once it is over.
    fn progress(&self, peer: usize, link: &mut Self::Link) -> Result<bool>;
    /// What poll(2) waits on while the setup goes on.
    fn pollfds(&self, link: &Self::Link) -> Vec<libc::pollfd>;
}

/// Where a peer's link stands.
enum State<L> {
    /// No link, nobody dialling.
    Unlinked,
    /// This rank is dialling the peer.
    Dialling,
    /// The peer's streams accepted so far (a peer across hosts may have several).
    Accepting(Vec<TcpStream>),
    /// All streams accepted, the link's setup going on in the accepting thread (since when).
    Finishing(L, Instant),
    /// Set up, for the mesh to take.
    Arrived(L),
    /// The setup failed, for the mesh to report.
    Failed(Error),
    /// The mesh has the link.
    Linked,
}

/// Who this rank is in its group, as hellos are checked (renumbered by a shrink).
#[derive(Debug, Clone, Copy)]
struct View {
    job: u64,
    group: u32,
    rank: usize,
    size: usize,
}

/// The links of a group, shared by the mesh (which dials) and the accepting thread.
struct Book<S: LinkSetup> {
    view: View,
    own_ip: IpAddr,
    /// Streams to each peer on another host.
    streams: usize,
    addrs: Vec<Option<SocketAddr>>,
    links: Vec<State<S::Link>>,
    setup: S,
}

impl<S: LinkSetup> Book<S> {
    /// The state of `peer`'s link once all its streams are in: its setup under way.
    fn begin(&self, peer: usize, socks: Vec<TcpStream>) -> State<S::Link> {
        match self.setup.start(peer, socks) {
            Ok(link) => State::Finishing(link, Instant::now()),
            Err(e) => State::Failed(e),
        }
    }

    /// Moves on the setup of every link accepted; how many came to an end (set up or failed).
    fn finish_links(&mut self) -> usize {
        let mut ended = 0;
        for peer in 0..self.links.len() {
            if !matches!(self.links[peer], State::Finishing(..)) {
                continue;
            }
            let State::Finishing(mut link, since) =
                std::mem::replace(&mut self.links[peer], State::Unlinked)
            else {
                continue;
            };
            self.links[peer] = match self.setup.progress(peer, &mut link) {
                Ok(false) if since.elapsed() < HANDSHAKE_TIMEOUT => State::Finishing(link, since),
                Ok(false) => State::Failed(Error::network(format!(
                    "rank {}: the link rank {peer} made did not finish its setup (TLS \
                     handshake) in {} s",
                    self.view.rank,
                    HANDSHAKE_TIMEOUT.as_secs()
                ))),
                Ok(true) => State::Arrived(link),
                Err(e) => State::Failed(e),
            };
            ended += usize::from(!matches!(self.links[peer], State::Finishing(..)));
        }
        ended
    }

    /// What poll(2) waits on for the setups going on.
    fn setup_pollfds(&self) -> impl Iterator<Item = libc::pollfd> + '_ {
        self.links.iter().flat_map(|state| match state {
            State::Finishing(link, _) => self.setup.pollfds(link),
            _ => Vec::new(),
        })
    }

    /// Takes `peer`'s link if it has come to an end: set up, or the error it failed with.
    fn take_ended(&mut self, peer: usize) -> Option<Result<S::Link>> {
        match std::mem::replace(&mut self.links[peer], State::Linked) {
            State::Arrived(link) => Some(Ok(link)),
            State::Failed(e) => Some(Err(e)),
            other => {
                self.links[peer] = other;
                None
            }
        }
    }

    /// Streams to `peer`: several across hosts (both ends compare the same two addresses).
    fn streams_to(&self, peer: usize) -> usize {
        match self.addrs[peer] {
            Some(addr) if self.streams > 1 && addr.ip() != self.own_ip => self.streams,
            _ => 1,
        }
    }
}

impl<S: LinkSetup> Admission for Book<S> {
    fn refusal(&self, slot: Slot) -> Option<(Status, String)> {
        let Slot { peer, stream } = slot;
        let me = self.view.rank;
        match (&self.links[peer], stream) {
            (State::Unlinked, 0) => None,
            // Both dialled: the lower rank's connection is the one kept.
            (State::Dialling, 0) if peer < me => None,
            (State::Dialling, 0) => Some((Status::Duplicate, String::new())),
            (State::Accepting(got), s) if s == got.len() && s < self.streams_to(peer) => None,
            (_, 0) => Some((
                Status::Duplicate,
                format!("a second connection claims rank {peer}, which is already connected"),
            )),
            _ => Some((
                Status::BadRank,
                format!("rank {peer} offers stream {stream}, which rank {me} does not expect"),
            )),
        }
    }

    fn admit(&mut self, slot: Slot, sock: TcpStream) {
        let want = self.streams_to(slot.peer);
        let mut got = match std::mem::replace(&mut self.links[slot.peer], State::Unlinked) {
            State::Accepting(got) => got,
            _ => Vec::new(),
        };
        got.push(sock);
        self.links[slot.peer] = if got.len() == want {
            self.begin(slot.peer, got)
        } else {
            State::Accepting(got)
        };
    }
}

struct Shared<S: LinkSetup> {
    book: Mutex<Book<S>>,
    /// Notified when a link arrives.
    arrived: Condvar,
    /// Set when links wait to be taken, so that the mesh looks without the lock.
    waiting: AtomicBool,
    key: Option<AuthKey>,
    listener: TcpListener,
    /// Rung on each arrival: the mesh polls it to wake.
    wake: Wake,
    /// Tells the accepting thread to end (with the listener shut down to wake it).
    stop: AtomicBool,
}

impl<S: LinkSetup> Shared<S> {
    fn lock(&self) -> MutexGuard<'_, Book<S>> {
        // A panic while holding the lock leaves plain data: go on with it.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A group's links on demand: its listener served by a thread, and the dialling side.
pub struct OnDemand<S: LinkSetup> {
    shared: Arc<Shared<S>>,
    thread: Option<JoinHandle<()>>,
}

impl<S: LinkSetup> OnDemand<S> {
    /// Links on demand after `mesh` (the links it made, those peers made early, its listener
    /// and the handshakes in progress there) for group `group` as rank `rank`: `streams` per
    /// peer on another host, hellos checked with `key` when set, links made with `setup`.
    /// None alone in the group.
    pub fn start(
        mesh: &mut Mesh,
        group: u32,
        rank: usize,
        streams: usize,
        key: Option<AuthKey>,
        setup: S,
    ) -> Result<Option<OnDemand<S>>> {
        let Some((listener, accepting)) = mesh.take_listener() else {
            return Ok(None);
        };
        let size = mesh.socks.len();
        let io_err = |e: io::Error| Error::network(format!("links on demand: {e}"));
        let own_ip = listener.local_addr().map_err(io_err)?.ip();
        listener.set_nonblocking(true).map_err(io_err)?;
        let mut book = Book {
            view: View {
                job: mesh.job,
                group,
                rank,
                size,
            },
            own_ip,
            streams,
            addrs: mesh.addrs.clone(),
            links: (0..size).map(|_| State::Unlinked).collect(),
            setup,
        };
        let mut early = std::mem::take(&mut mesh.early)
            .into_iter()
            .chain(std::iter::repeat_with(|| None));
        for p in 0..size {
            let got = early.next().flatten().unwrap_or_default();
            book.links[p] = if p == rank || mesh.socks[p].is_some() {
                State::Linked
            } else if got.is_empty() {
                State::Unlinked
            } else if got.len() >= book.streams_to(p) {
                book.begin(p, got)
            } else {
                State::Accepting(got)
            };
        }
        let shared = Arc::new(Shared {
            book: Mutex::new(book),
            arrived: Condvar::new(),
            waiting: AtomicBool::new(false),
            key,
            listener,
            wake: Wake::new().map_err(io_err)?,
            stop: AtomicBool::new(false),
        });
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rustdist-accept-{rank}"))
            .spawn(move || serve(&serving, accepting))
            .map_err(io_err)?;
        Ok(Some(OnDemand {
            shared,
            thread: Some(thread),
        }))
    }

    /// A link to `peer`: one that arrived, else this rank dials it (and, if `peer` dialled at
    /// the same moment and wins, takes its connection), before `deadline` or until `stop`
    /// says. A link this rank dialled has its setup begun, not finished. A peer that refuses
    /// the connection has exited.
    pub fn link(&self, peer: usize, deadline: Instant, stop: &dyn Fn() -> bool) -> Result<S::Link> {
        let (view, addr, streams) = {
            let mut book = self.shared.lock();
            if let Some(ended) = book.take_ended(peer) {
                return ended;
            }
            match std::mem::replace(&mut book.links[peer], State::Dialling) {
                State::Unlinked => {}
                // The peer is dialling this rank (its streams on their way, or its link
                // being set up): wait for it.
                waiting @ (State::Accepting(_) | State::Finishing(..)) => {
                    book.links[peer] = waiting;
                    drop(book);
                    return self.wait_for(peer, deadline, stop);
                }
                State::Arrived(_) | State::Failed(_) | State::Linked | State::Dialling => {
                    book.links[peer] = State::Linked;
                    return Err(Error::backend(format!("rank {peer} is linked already")));
                }
            }
            (book.view, book.addrs[peer], book.streams_to(peer))
        };
        let dialled = match addr {
            Some(addr) => self.dial(view, peer, addr, streams, deadline, stop),
            None => Err(Error::backend(format!("rank {peer}'s address is unknown"))),
        };
        let mut book = self.shared.lock();
        match dialled {
            Ok(Some(socks)) => {
                book.links[peer] = State::Linked;
                book.setup.start(peer, socks)
            }
            // Refused: the peer dialled too and its connection is the one kept.
            Ok(None) => {
                drop(book);
                self.wait_for(peer, deadline, stop)
            }
            Err(e) => {
                if matches!(book.links[peer], State::Dialling) {
                    book.links[peer] = State::Unlinked;
                }
                Err(e)
            }
        }
    }

    /// Dials every stream to `peer` at `addr`; None when the peer refused the first because
    /// it dialled this rank at the same moment and its connection wins.
    fn dial(
        &self,
        view: View,
        peer: usize,
        addr: SocketAddr,
        streams: usize,
        deadline: Instant,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Vec<TcpStream>>> {
        let end = DialEnd {
            refused_is_final: true,
            stop: Some(stop),
        };
        let mut socks = Vec::with_capacity(streams);
        for stream in 0..streams {
            let hello = Hello {
                job: view.job,
                group: view.group,
                size: u32::try_from(view.size)
                    .map_err(|_| Error::invalid("world size exceeds u32"))?,
                rank: view.rank as u64,
                stream: stream as u32,
                auth: self.shared.key.is_some(),
                nonce: [0; NONCE_LEN],
            };
            match dial_once(hello, self.shared.key.as_ref(), peer, addr, deadline, end)? {
                Dialled::Admitted(sock, _) => socks.push(sock),
                Dialled::Refused(Status::Duplicate) if stream == 0 && peer < view.rank => {
                    return Ok(None)
                }
                Dialled::Refused(status) => return Err(refused(hello.rank, peer, addr, status)),
            }
        }
        Ok(Some(socks))
    }

    /// Waits for `peer`'s link, which it is dialling, until `deadline` or `stop`.
    fn wait_for(&self, peer: usize, deadline: Instant, stop: &dyn Fn() -> bool) -> Result<S::Link> {
        const STOP_SLICE: Duration = Duration::from_millis(50);
        let mut book = self.shared.lock();
        loop {
            if let Some(ended) = book.take_ended(peer) {
                return ended;
            }
            let left = remaining(deadline).filter(|_| !stop());
            let Some(left) = left else {
                return Err(Error::network(format!(
                    "rank {} gave up waiting for rank {peer} to connect",
                    book.view.rank
                )));
            };
            book = self
                .shared
                .arrived
                .wait_timeout(book, left.min(STOP_SLICE))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Links that arrived without this rank asking (the peers that dialled it), set up, or
    /// the errors their setup failed with, by peer.
    pub fn arrivals(&self) -> Vec<(usize, Result<S::Link>)> {
        // Drained first, so that a wake written after the flag was cleared stays readable.
        self.shared.wake.drain();
        if !self.shared.waiting.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        let mut book = self.shared.lock();
        (0..book.links.len())
            .filter_map(|p| book.take_ended(p).map(|ended| (p, ended)))
            .collect()
    }

    /// What the mesh polls to wake when a link arrives.
    pub fn wake_fd(&self) -> libc::pollfd {
        self.shared.wake.pollfd()
    }

    /// Goes on as the group of the ranks `keep` (sorted, old numbers) with id `group`: the
    /// links and addresses renumbered, hellos checked against the new group and links made
    /// from now on with the setup `renumber` makes of the old one.
    pub fn renumber(&self, keep: &[usize], group: u32, renumber: impl FnOnce(&S) -> S) {
        let mut book = self.shared.lock();
        book.setup = renumber(&book.setup);
        let old_rank = book.view.rank;
        let mut links: Vec<State<S::Link>> = keep
            .iter()
            .map(|&p| std::mem::replace(&mut book.links[p], State::Unlinked))
            .collect();
        // A half-accepted peer starts over: its dialler fails and the group with it.
        for state in &mut links {
            if matches!(state, State::Accepting(_)) {
                *state = State::Unlinked;
            }
        }
        book.addrs = keep.iter().map(|&p| book.addrs[p]).collect();
        book.links = links;
        book.view.group = group;
        book.view.size = keep.len();
        book.view.rank = keep.iter().position(|&p| p == old_rank).unwrap_or(0);
    }
}

impl<S: LinkSetup> Drop for OnDemand<S> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the thread's poll at once (a shut listener reads as hung up).
        let _ = SockRef::from(&self.shared.listener).shutdown(Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The accepting thread: serves the listener (its handshakes in progress in `accepting`) and
/// sets up the links accepted, until told to stop.
fn serve<S: LinkSetup>(shared: &Shared<S>, mut accepting: Accepting) {
    while !shared.stop.load(Ordering::Acquire) {
        let (ended, mut fds) = {
            let mut book = shared.lock();
            let View {
                job,
                group,
                rank,
                size,
            } = book.view;
            let acceptor = Acceptor {
                rank,
                size,
                group,
                job,
                key: shared.key.as_ref(),
            };
            accepting.serve(&shared.listener, &acceptor, &mut *book);
            let ended = book.finish_links();
            let mut fds = accepting.pollfds(&shared.listener);
            fds.extend(book.setup_pollfds());
            (ended, fds)
        };
        if ended > 0 {
            shared.waiting.store(true, Ordering::Release);
            shared.arrived.notify_all();
            shared.wake.ring();
        }
        poll_fds(&mut fds, Duration::from_millis(500));
    }
}
