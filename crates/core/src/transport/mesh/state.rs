//! The mesh transport's state, below every part that works on it: the transport itself, each
//! peer's link, queues and stashes, the frames and receives they hold, and the helpers the
//! parts share (`peer`; `fail` and `check_failed` for the sticky error). The parts (`tx`,
//! `p2p`, `rx`, `progress`, `shared`) add their methods in their own files; none uses
//! `mod.rs`, which connects the transport and implements
//! [`Transport`](crate::transport::Transport) on them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link::Connection;
use super::secure::OnDemandLinks;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::recorder;
use crate::tensor::RawBuf;
use crate::transport::frame::{Header, HEADER_LEN};
use crate::transport::heartbeat::Heartbeat;
use crate::transport::shm::ShmHost;
use crate::transport::tcp::OnDemand;
use crate::transport::window::WindowMemory;
use crate::transport::workspace::Workspace;
use crate::transport::{OpCtx, P2pDone};
use crate::wake::Wake;

/// How long a timeout waits for the peers' answers to what they are doing (they come within
/// a round trip; a peer that does not answer is described by its last beat, if any).
const STATUS_ASK_WAIT: Duration = Duration::from_millis(500);

/// The mesh transport of one group.
pub struct MeshTransport {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) group: u32,
    pub(super) peers: Vec<Option<Peer>>,
    /// Collective sequence number of the current message counters.
    pub(super) seq: u64,
    pub(super) sent_steps: Vec<u32>,
    pub(super) recv_steps: Vec<u32>,
    pub(super) posted: Vec<PostedRecv>,
    pub(super) next_id: u64,
    /// Tagged messages this rank sent to itself, waiting for a matching receive.
    pub(super) own_tagged: VecDeque<Frame>,
    pub(super) failed: Option<Error>,
    /// The group's abort signal, polled while waiting.
    pub(super) cancel: Arc<Cancel>,
    /// Host index of every rank (ranks of a host share memory).
    pub(super) host_of: Vec<usize>,
    /// The workspace of the ranks on this host, when there are several.
    pub(super) ws: Option<Workspace>,
    /// The collective the workspace was last told about.
    pub(super) ws_seq: u64,
    /// When the progress loop last read every peer (None: at the next round; see
    /// `progress.rs`).
    pub(super) swept: Option<Instant>,
    /// The links' one-way latency measured at connect (the same on every rank).
    pub(super) latency: Option<Duration>,
    /// The slowest link between hosts in bytes per second, measured at connect (the same on
    /// every rank; None when the group is on one host).
    pub(super) bandwidth: Option<u64>,
    /// TCP streams to each peer on another host (1 on one host).
    pub(super) streams: usize,
    /// Fails the group (through `cancel`) when a peer goes silent; stopped at shutdown.
    pub(super) heartbeat: Option<Heartbeat>,
    /// Time slept waiting for peers since the group last took it (its counters).
    pub(super) waited: Duration,
    /// Links made on first use, with the TLS settings they are made with (None: every peer
    /// was linked at connect, and no link is made later).
    pub(super) on_demand: Option<OnDemand<OnDemandLinks>>,
    /// This rank's windows that take frames from peers (SEPARATE access).
    pub(super) windows: Vec<AttachedWindow>,
    /// Windows attached so far (the next one's id).
    pub(super) windows_made: u32,
    /// Rung when work is queued for the group's worker while it pumps (`set_wake`).
    pub(super) wake: Option<Arc<Wake>>,
    /// Shared memory with the peers on this host; after `peers` and `ws`, so the pipes and
    /// the workspace go first.
    pub(super) host: Option<ShmHost>,
}

impl MeshTransport {
    pub(super) fn peer(&mut self, p: usize) -> Result<&mut Peer> {
        let size = self.size;
        self.peers
            .get_mut(p)
            .and_then(|x| x.as_mut())
            .ok_or_else(|| {
                Error::invalid(format!("rank {p} is not a peer in a group of size {size}"))
            })
    }

    /// Makes `e` the transport's sticky error and fails every pending point-to-point operation
    /// (dropping queued frames, whose borrowed payloads must not be touched after this).
    ///
    /// Every link stays a sequence of whole frames, so that a shrink (`shrink.rs`) can go on
    /// using it: a frame half written is kept and finished with zeros in place of its payload,
    /// control frames (which own their bytes) stay queued, and a frame half read into a posted
    /// receive or a window has the rest of it skipped.
    pub(super) fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
        let mut dones = Vec::new();
        for peer in self.peers.iter_mut().flatten() {
            match peer.rx {
                Rx::Tagged { id } => {
                    let left = self
                        .posted
                        .iter()
                        .find(|r| r.id == id)
                        .map_or(0, |r| r.buf.len() - r.got);
                    peer.rx = Rx::skip(left);
                }
                Rx::Window { at, end, .. } => peer.rx = Rx::skip(end - at),
                _ => {}
            }
            let mut kept = VecDeque::new();
            let started = peer.started();
            for (i, mut frame) in peer.txq.drain(..).enumerate() {
                let control = frame.done.is_none() && frame.owned.is_some();
                if let Some((done, _)) = frame.done.take() {
                    dones.push(done);
                }
                if control {
                    kept.push_back(frame);
                } else if i < started {
                    frame.zero_payload();
                    kept.push_back(frame);
                }
            }
            peer.txq = kept;
        }
        dones.extend(self.posted.drain(..).filter_map(|r| r.done));
        for done in dones {
            done(Err(e.clone()));
        }
        e
    }

    pub(super) fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// How messages name rank `p` of this group: "rank 1 (global rank 3)" in a subgroup
    /// whose front door gave its members' global ranks, else "rank 1".
    pub(super) fn who(&self, p: usize) -> String {
        match recorder::global_rank_of(self.group, p) {
            Some(g) if g != p => format!("rank {p} (global rank {g})"),
            _ => format!("rank {p}"),
        }
    }

    /// What rank `p` last said it was doing, as a timeout of collective `ctx` quotes it:
    /// "rank 2 has not entered all_reduce #418 of group 'default_pg'; its last op is broadcast
    /// #17 of group 'tp' (started), issued 41.2 s ago". None when its heartbeats have said
    /// nothing (none yet, or heartbeats off).
    pub(super) fn peer_report(&self, p: usize, ctx: &OpCtx) -> Option<String> {
        let status = self.heartbeat.as_ref()?.peer_status(p)?;
        let op = format!("{} #{}", ctx.sig.kind.name(), ctx.seq);
        let group = recorder::label(self.group).unwrap_or_else(|| "?".into());
        let entered = if status.entered < ctx.seq {
            format!("has not entered {op} of group '{group}'")
        } else {
            format!("entered {op} of group '{group}'")
        };
        Some(format!(
            "{} {entered}; its last op is {}, issued {:.1} s ago",
            self.who(p),
            status.activity,
            status.age.as_secs_f64()
        ))
    }

    /// The peers whose heartbeats say they have not entered collective `ctx`.
    pub(super) fn not_entered(&self, ctx: &OpCtx) -> Vec<usize> {
        let Some(beat) = &self.heartbeat else {
            return Vec::new();
        };
        (0..self.size)
            .filter(|&p| p != self.rank)
            .filter(|&p| beat.peer_status(p).is_some_and(|s| s.entered < ctx.seq))
            .collect()
    }

    /// The timeout of collective `ctx`: it names the ranks whose heartbeats say they have not
    /// entered it (the cause, wherever they are), else `waited` (those this rank waits for
    /// directly: on one host, the workspace knows), with what each of them, and each waited
    /// rank that did enter (on another host, a leader waiting in turn), was last seen doing.
    pub(super) fn timeout_error(&self, ctx: &OpCtx, waited: &[usize]) -> Error {
        if let Some(beat) = &self.heartbeat {
            // Only the ring neighbours beat here: what the others are doing is asked now.
            let others: Vec<usize> = (0..self.size).filter(|&p| p != self.rank).collect();
            beat.ask(&others, STATUS_ASK_WAIT);
        }
        let behind = self.not_entered(ctx);
        let named = if behind.is_empty() {
            waited
        } else {
            &behind[..]
        };
        let what = format!("{} (collective #{})", ctx.sig.kind.name(), ctx.seq);
        if named.is_empty() {
            return Error::backend(format!(
                "{}: {what} Timed out waiting for its peers",
                self.who(self.rank)
            ));
        }
        let list: Vec<String> = named
            .iter()
            .map(|&p| self.who(p).trim_start_matches("rank ").to_string())
            .collect();
        let reports: Vec<String> = named
            .iter()
            .chain(waited.iter().filter(|p| !named.contains(p)))
            .filter_map(|&p| self.peer_report(p, ctx))
            .collect();
        let mut text = format!(
            "{}: {what} Timed out waiting for rank(s) {}",
            self.who(self.rank),
            list.join(", ")
        );
        if !reports.is_empty() {
            text = format!("{text}: {}", reports.join("; "));
        }
        Error::backend(text)
    }
}

pub(super) struct Peer {
    pub(super) link: Connection,
    pub(super) rx: Rx,
    pub(super) txq: VecDeque<OutFrame>,
    /// Frames ever queued: the next frame's ticket.
    pub(super) queued: u64,
    /// Collective frames received ahead of their receive (FIFO per peer).
    pub(super) collective: VecDeque<Frame>,
    /// Tagged frames waiting for a matching receive.
    pub(super) tagged: VecDeque<Frame>,
    /// Set once the peer said goodbye; its EOF is then not a failure.
    pub(super) left: bool,
    pub(super) closed: bool,
    /// Why the link ended without a goodbye (the peer died): the error of the first
    /// operation that still needs the peer. A peer that finished its part of an operation and
    /// then exited fails only what needs it afterwards.
    pub(super) lost: Option<String>,
    /// Scratch for `RecvReduce`: incoming bytes before they are reduced into place.
    pub(super) scratch: Vec<u8>,
    /// Payload buffers of consumed stashed frames, reused by the next ones: a ring step's
    /// frame often arrives before its receive is posted, and a fresh buffer each time costs
    /// page faults and zeroing on every step.
    pub(super) spare: Vec<Vec<u8>>,
    /// The peer's shrink frames (its markers that it left this group for a smaller one), by
    /// arrival; kept for the shrink that reads them.
    pub(super) shrinking: Vec<Frame>,
    /// Set once the peer's (last) shrink frame came: what follows in its link belongs to the
    /// group it shrank into, which reads it; this one must not.
    pub(super) paused: bool,
}

/// The error of an operation that needs peer `p`, whose link to `rank` ended without a goodbye.
pub(super) fn closed_unexpectedly(p: usize, rank: usize) -> String {
    format!("rank {p} closed its connection to rank {rank} unexpectedly; it probably died")
}

impl Peer {
    /// A peer to link on first use.
    pub(super) fn unlinked() -> Peer {
        Peer::new(Connection::unlinked())
    }

    pub(super) fn new(link: Connection) -> Peer {
        Peer {
            link,
            rx: RX_IDLE,
            txq: VecDeque::new(),
            queued: 0,
            collective: VecDeque::new(),
            tagged: VecDeque::new(),
            left: false,
            closed: false,
            lost: None,
            scratch: Vec::new(),
            spare: Vec::new(),
            shrinking: Vec::new(),
            paused: false,
        }
    }

    /// Whether a frame from this peer is partly read (its header begun, or its payload
    /// streaming somewhere).
    pub(super) fn mid_frame(&self) -> bool {
        !matches!(self.rx, Rx::Header { got: 0, .. } | Rx::Held(_))
    }

    /// Whether a collective frame from this peer waits in its link (see `rx::holds`).
    pub(super) fn holds_frame(&self) -> bool {
        matches!(self.rx, Rx::Held(_))
    }

    /// Whether its link holds bytes this rank must not read now: a held frame's payload, or
    /// what follows a shrink frame.
    pub(super) fn unread(&self) -> bool {
        self.paused || self.holds_frame()
    }

    /// How many queued frames have been started (partly or wholly written): a prefix of the
    /// queue, which nothing may be put ahead of or dropped from.
    pub(super) fn started(&self) -> usize {
        self.txq.iter().take_while(|f| f.off > 0).count()
    }

    /// A buffer for the payload of a frame read into the stash: a spare one when there is
    /// one. Its length is stale; the stash grows it as bytes arrive and trims it at the end.
    pub(super) fn stash_buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// Keeps a consumed stash payload for reuse (a few per peer, none very large, so memory
    /// stays bounded).
    pub(super) fn recycle(&mut self, payload: Vec<u8>) {
        if self.spare.len() < SPARE_STASH_BUFFERS && payload.capacity() <= SPARE_MAX_BYTES {
            self.spare.push(payload);
        }
    }
}

/// Spare stash buffers kept per peer.
const SPARE_STASH_BUFFERS: usize = 2;
/// The largest stash buffer kept for reuse: a collective's frame fits (the ring all_reduce's
/// chunks are at most 16 MiB), a large point-to-point message is not kept.
const SPARE_MAX_BYTES: usize = 16 << 20;

/// A frame queued for a peer. The payload is borrowed from the caller, who keeps it alive until
/// the frame is flushed (a collective step waits for that; a posted send's Work holds it).
pub(super) struct OutFrame {
    pub(super) header: [u8; HEADER_LEN],
    pub(super) data: RawBuf,
    pub(super) off: usize,
    /// Identifies the frame to the step waiting for it.
    pub(super) ticket: u64,
    /// Completion of a point-to-point send, with its deadline.
    pub(super) done: Option<(P2pDone, Instant)>,
    /// The payload's own copy, once it has been detached from the caller's memory.
    pub(super) owned: Option<Vec<u8>>,
}

impl OutFrame {
    /// Its length on the link: header and payload.
    pub(super) fn total(&self) -> usize {
        HEADER_LEN + self.data.len()
    }

    /// A frame that owns its payload (control frames: no caller keeps anything alive).
    pub(super) fn owned(hdr: Header, mut payload: Vec<u8>) -> OutFrame {
        OutFrame {
            header: hdr.encode(),
            data: RawBuf::from_mut_slice(&mut payload),
            off: 0,
            ticket: 0,
            done: None,
            owned: Some(payload),
        }
    }

    /// Sends a copy of the payload from here on: the caller's memory is about to be written
    /// (a receive posted over it) while the send is still queued.
    pub(super) fn detach(&mut self) {
        if self.owned.is_some() {
            return;
        }
        // SAFETY: the frame's owner keeps the payload alive until it is flushed (see above).
        let mut copy = unsafe { self.data.as_slice() }.to_vec();
        // The Vec's heap buffer stays put when the Vec moves into the frame.
        self.data = RawBuf::from_mut_slice(&mut copy);
        self.owned = Some(copy);
    }

    /// Sends zeros for the rest of the payload: its owner is gone (the transport failed), but
    /// the frame was half written and the link must stay whole frames. A large zeroed
    /// allocation maps the zero page, so this costs no memory until written.
    pub(super) fn zero_payload(&mut self) {
        let mut zeros = vec![0u8; self.data.len()];
        self.data = RawBuf::from_mut_slice(&mut zeros);
        self.owned = Some(zeros);
    }
}

/// One of this rank's windows, taking puts and signals from peers over the links.
pub(super) struct AttachedWindow {
    pub(super) id: u32,
    pub(super) memory: Arc<WindowMemory>,
    /// The peers whose last frame of the window has arrived (they deregistered it).
    pub(super) closed: Vec<bool>,
}

/// A complete frame read before anyone asked for it.
pub(super) struct Frame {
    pub(super) hdr: Header,
    pub(super) payload: Vec<u8>,
}

/// Where the bytes of the frame being read from a peer go.
pub(super) enum Rx {
    /// Reading a header.
    Header { buf: [u8; HEADER_LEN], got: usize },
    /// Streaming into receive `idx` of the current collective step.
    Posted { idx: usize },
    /// Streaming into the posted point-to-point receive with this id.
    Tagged { id: u64 },
    /// A collective frame's header, read while no step expected its peer; the payload waits
    /// in the link (see `rx::holds`).
    Held(Header),
    /// Collecting a frame nobody asked for yet.
    Stash { frame: Frame, got: usize },
    /// Dropping the rest of a frame whose receive failed (it was matched, so it is consumed).
    Discard { left: usize },
    /// Streaming a put into this rank's window: bytes `at..end` of its registered memory.
    Window {
        memory: Arc<WindowMemory>,
        at: usize,
        end: usize,
    },
}

pub(super) const RX_IDLE: Rx = Rx::Header {
    buf: [0; HEADER_LEN],
    got: 0,
};

impl Rx {
    /// Skips the next `left` bytes (the rest of a frame nobody will take), then reads headers.
    pub(super) fn skip(left: usize) -> Rx {
        if left == 0 {
            RX_IDLE
        } else {
            Rx::Discard { left }
        }
    }
}

/// A posted point-to-point receive.
pub(super) struct PostedRecv {
    pub(super) id: u64,
    pub(super) src: Option<usize>,
    pub(super) tag: u64,
    pub(super) buf: RawBuf,
    pub(super) got: usize,
    /// The sender, once a frame is streaming in.
    pub(super) from: Option<usize>,
    pub(super) deadline: Instant,
    pub(super) done: Option<P2pDone>,
}
