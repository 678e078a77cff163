//! The shared-memory workspace of the ranks of a group that share a host: the memory that
//! collectives run in directly, instead of streaming bytes through pipes.
//!
//! Every rank owns one region (in its shared segment, see `shm.rs`) that only it writes and
//! the others read: a progress line (the last step it published), an announce ring (the
//! collectives it entered, for mismatch checks), flag entries per collective kind (the step
//! number, the collective's signature, then up to [`INLINE_BYTES`] of data on the same two
//! cache lines; [`DEPTH`] of them per kind, used in turn), and two data slots.
//!
//! The protocol, in steps numbered 1, 2, ... identically on every rank (all ranks run the same
//! sequence of collectives, each a fixed number of steps):
//! - a step's flag entry is number `step % DEPTH` of its kind, its slot number `step % 2`
//!   (small data published whole at one of two places in it, see [`ROTATED_MAX_BYTES`]);
//! - a rank publishes every step (with or without data) by storing the step number;
//! - a rank reads the data of step `s` only after seeing the writer's flag reach `s`, and only
//!   before it publishes `s + 1`;
//! - so before writing the slot of step `s` a rank makes sure every peer has published `s - 1`
//!   (it has then finished reading step `s - 2`, the slot's previous use), and before writing
//!   only the flag entry of step `s`, that every peer has published `s - DEPTH + 1`.
//!
//! Small messages therefore cost one or two cache-line transfers per peer and one wait, and a rank
//! whose steps carry no slot data (the root of small broadcasts, say) runs up to `DEPTH - 1`
//! steps ahead of the slowest reader instead of waiting for it every time. The signature
//! travels with every step, so ranks that disagree about a collective (size, dtype, op) are
//! caught on the first step; collectives keep separate flag entries per kind, so ranks in
//! different collectives never read each other's flags as their own (that mismatch is named
//! from the announce ring, which waiters read while they wait).

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::transport::cma;
use crate::transport::signature::Signature;
use crate::types::CollectiveKind;

/// Bytes of a cache line: flags sit on lines of their own.
pub const LINE: usize = 64;
/// Bytes of a flag entry: two cache lines, so that 64 bytes of data still travel inline.
const FLAG_BYTES: usize = 2 * LINE;
/// Payload bytes carried in a flag entry next to the step number and the signature.
pub const INLINE_BYTES: usize = FLAG_BYTES - 16;
/// Bytes of one data slot (each rank has two).
pub const SLOT_BYTES: usize = 1 << 20;
/// Data of at most this many bytes, published whole, sits at the start of its slot or in the
/// middle, in turn every other step: a rank then rewrites memory its peers last read four
/// steps back, not two. Copying into lines a peer read two steps back cost twice as long
/// below about 44 KiB at world 2 (docs/tuning.md, "Where a slot's data sits").
pub const ROTATED_MAX_BYTES: usize = 64 << 10;
/// Flag lines per collective kind, used in turn (a power of two): how many steps without slot
/// data a rank may publish ahead of the slowest local rank. Deep, so that with more ranks than
/// cores the root of small broadcasts publishes a whole time slice ahead and its readers drain
/// it in one turn each (16: 1.3-1.7 us per 8-byte broadcast at world 4 on 2 cores; 256: 0.9).
pub const DEPTH: u64 = 256;

const KINDS: usize = CollectiveKind::ALL.len();
const PROGRESS: usize = 0;
/// Words after PROGRESS, each a collective's sequence number + 1 (0: none yet): the last in
/// which this rank started writing into local peers' buffers (`cma`), the last in which it
/// finished or gave up doing so, and the last in which it withdrew the buffer it had
/// published for peers to write into.
const WRITING: usize = 8;
const WRITTEN: usize = 16;
const WITHDRAWN: usize = 24;
const ANNOUNCE: usize = LINE;
/// Bytes of one announce entry: sequence number, packed signature, element count.
const ENTRY: usize = 32;
const FLAGS: usize = ANNOUNCE + DEPTH as usize * ENTRY;
const PAGE: usize = 4096;
const SLOTS: usize = (FLAGS + KINDS * DEPTH as usize * FLAG_BYTES).div_ceil(PAGE) * PAGE;

/// Bytes of one rank's workspace region (a multiple of the page size).
pub const REGION_BYTES: usize = SLOTS + 2 * SLOT_BYTES;
/// An announce entry being rewritten.
const REWRITING: u64 = u64::MAX;

/// What a rank says about the collective it is in; read by peers only to name a mismatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announced {
    pub seq: u64,
    pub sig: u64,
    pub count: u64,
}

/// The signature packed into one word (kind, dtype, op); [`unpacked`] reverses it.
fn packed(sig: &Signature) -> u64 {
    (sig.kind as u64) | ((sig.dtype as u64) << 8) | ((sig.op as u64) << 16)
}

/// The word each step carries: the whole signature, element count included, folded.
fn stamp(sig: &Signature) -> u64 {
    packed(sig) ^ sig.count.rotate_left(24) ^ 0x9e37_79b9_7f4a_7c15
}

/// Whether a peer has published the current step, and with which signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    Pending,
    Arrived,
    /// It published the step, for a collective that differs from this rank's.
    Mismatch,
}

/// The kind, dtype and op codes of a packed signature.
pub fn unpacked(word: u64) -> (u8, u8, u8) {
    (word as u8, (word >> 8) as u8, (word >> 16) as u8)
}

/// One rank's view of the workspace: its own region and its local peers'.
pub struct Workspace {
    /// This rank's index among the local ranks.
    me: usize,
    /// Group rank of each local rank, in increasing order.
    ranks: Vec<usize>,
    /// Base of each local rank's region (this rank's included).
    regions: Vec<*mut u8>,
    /// Steps this rank has published.
    step: u64,
    /// Steps each local rank is known to have published.
    known: Vec<u64>,
    /// The collective kind of the current operation and its signature word.
    kind: CollectiveKind,
    stamp: u64,
    /// Process id of each local rank when they may read each other's memory (`cma`).
    pids: Option<Vec<i32>>,
    /// More local ranks than CPUs for them.
    oversubscribed: bool,
}

// SAFETY: the regions are shared memory mapped for the workspace's whole life (the mesh drops
// the workspace before the segments); access follows the protocol above, through atomics for
// flags and through slices only where the protocol gives a rank exclusive or stable access.
unsafe impl Send for Workspace {}

/// What the workspace offers the single-copy algorithms: whether the ranks of a host may read
/// each other's memory ([`Workspace::single_copy`]), and whether each has a core of its own
/// ([`Workspace::oversubscribed`]). A fact of the transport; `algorithms::select` decides
/// from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SingleCopy {
    Unavailable,
    /// More ranks on the host than cores: a rank waiting for a peer on its own core yields
    /// it, and the kernel charges the yielder CPU time until the peer has had its share, so
    /// an algorithm that waits for every rank after every read costs twice its copies
    /// (measurements: docs/tuning.md, "More ranks than cores").
    SharedCores,
    CoreEach,
}

impl Workspace {
    /// A workspace over `regions` (one per local rank, ordered by group rank `ranks`; this
    /// rank is local rank `me`). Each region is [`REGION_BYTES`] of zeroed, mapped memory
    /// that lives as long as the workspace.
    ///
    /// # Safety
    /// Every pointer must be valid for [`REGION_BYTES`] bytes, 64-byte aligned, and shared
    /// with the rank it belongs to for the workspace's lifetime.
    pub unsafe fn new(me: usize, ranks: Vec<usize>, regions: Vec<*mut u8>) -> Workspace {
        let n = regions.len();
        Workspace {
            me,
            ranks,
            regions,
            step: 0,
            known: vec![0; n],
            kind: CollectiveKind::Barrier,
            stamp: 0,
            pids: None,
            oversubscribed: false,
        }
    }

    /// The workspace, with `pids` (one per local rank) when every local rank may read every
    /// other's memory: single-copy transfers ([`Workspace::read_from`]).
    pub fn with_pids(mut self, pids: Option<Vec<i32>>) -> Workspace {
        self.pids = pids.filter(|p| p.len() == self.regions.len());
        self
    }

    /// The workspace of ranks that have `cores` CPUs between them.
    pub fn with_cores(mut self, cores: usize) -> Workspace {
        self.oversubscribed = cores < self.regions.len();
        self
    }

    /// Whether [`Workspace::read_from`] is available.
    pub fn single_copy(&self) -> bool {
        self.pids.is_some()
    }

    /// Whether the local ranks are more than the CPUs they may run on (a rank that busy-waits
    /// then takes the core a peer needs).
    pub fn oversubscribed(&self) -> bool {
        self.oversubscribed
    }

    /// Copies `dst.len()` bytes at address `addr` of local rank `p`'s process into `dst`.
    pub fn read_from(&self, p: usize, addr: usize, dst: &mut [u8]) -> std::io::Result<()> {
        cma::read(self.pid(p)?, addr, dst)
    }

    /// Copies `src` to address `addr` of local rank `p`'s process.
    pub fn write_to(&self, p: usize, addr: usize, src: &[u8]) -> std::io::Result<()> {
        cma::write(self.pid(p)?, addr, src)
    }

    fn pid(&self, p: usize) -> std::io::Result<i32> {
        match &self.pids {
            Some(pids) => Ok(pids[p]),
            None => Err(std::io::ErrorKind::Unsupported.into()),
        }
    }

    /// This rank's index among the ranks of the host.
    pub fn local_rank(&self) -> usize {
        self.me
    }

    /// Number of ranks of the group on this host.
    pub fn local_size(&self) -> usize {
        self.regions.len()
    }

    /// Group ranks of the local ranks, by local index.
    pub fn group_ranks(&self) -> &[usize] {
        &self.ranks
    }

    fn word(&self, rank: usize, offset: usize) -> &AtomicU64 {
        // SAFETY: offset + 8 lies inside the region (a layout constant) at an 8-byte aligned
        // address; the word is only accessed atomically.
        unsafe { &*(self.regions[rank].add(offset) as *const AtomicU64) }
    }

    fn flag_offset(&self, step: u64) -> usize {
        FLAGS + (self.kind as usize * DEPTH as usize + (step % DEPTH) as usize) * FLAG_BYTES
    }

    fn entry_offset(seq: u64) -> usize {
        ANNOUNCE + (seq % DEPTH) as usize * ENTRY
    }

    /// Starts a collective: says which one (peers read it only to report a mismatch).
    pub fn begin(&mut self, seq: u64, sig: &Signature) {
        self.kind = sig.kind;
        self.stamp = stamp(sig);
        let (me, at) = (self.me, Self::entry_offset(seq));
        // A seqlock: readers discard an entry whose number changed while they read it.
        self.word(me, at).store(REWRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        self.word(me, at + 8).store(packed(sig), Ordering::Relaxed);
        self.word(me, at + 16).store(sig.count, Ordering::Relaxed);
        self.word(me, at).store(seq, Ordering::Release);
    }

    /// What local rank `p` announced in the announce entry of collective `seq`: that
    /// collective when `seq` matches, an older one when p has not reached it yet, a newer one
    /// when p is ahead (`None` while p rewrites the entry).
    pub fn announced(&self, p: usize, seq: u64) -> Option<Announced> {
        let at = Self::entry_offset(seq);
        let seen = self.word(p, at).load(Ordering::Acquire);
        let a = Announced {
            seq: seen,
            sig: self.word(p, at + 8).load(Ordering::Relaxed),
            count: self.word(p, at + 16).load(Ordering::Relaxed),
        };
        fence(Ordering::Acquire);
        (seen != REWRITING && self.word(p, at).load(Ordering::Relaxed) == seen).then_some(a)
    }

    /// Whether `sig` (this rank's) differs from what `a` (a peer's announce) packs.
    pub fn differs(sig: &Signature, a: &Announced) -> bool {
        a.sig != packed(sig) || a.count != sig.count
    }

    /// True when every local rank is done with what the next step overwrites: with `slot`,
    /// the slot of its parity (last used two steps back: every rank has published the
    /// current step), else just its flag entry (last used [`DEPTH`] steps back).
    pub fn may_write(&mut self, slot: bool) -> bool {
        if slot {
            self.peers_reached(self.step)
        } else {
            self.may_write_flag(DEPTH)
        }
    }

    /// True when every local rank is within `room` steps (at most [`DEPTH`]) of the next
    /// step, so the step may be published without slot data.
    pub fn may_write_flag(&mut self, room: u64) -> bool {
        self.peers_reached((self.step + 2).saturating_sub(room))
    }

    /// Whether every local rank has published step `need`. Reads the peers' progress only
    /// when not yet known.
    fn peers_reached(&mut self, need: u64) -> bool {
        for p in 0..self.known.len() {
            if self.known[p] < need {
                self.known[p] = self.word(p, PROGRESS).load(Ordering::Acquire);
                if self.known[p] < need {
                    return false;
                }
            }
        }
        true
    }

    /// This rank's data slot for the next step. Only valid after [`Workspace::may_write`]
    /// said yes for a slot (the caller waits for that first).
    fn next_slot(&mut self) -> &mut [u8] {
        let at = SLOTS + ((self.step + 1) % 2) as usize * SLOT_BYTES;
        // SAFETY: the slot lies inside this rank's region; only this rank writes it, and no
        // peer reads it any more (may_write: every peer is past its previous use).
        unsafe { std::slice::from_raw_parts_mut(self.regions[self.me].add(at), SLOT_BYTES) }
    }

    /// Publishes the next step with `inline` (at most [`INLINE_BYTES`]) in its flag entry;
    /// returns the step. Data meant for the step's slot must be written before.
    pub fn publish(&mut self, inline: &[u8]) -> u64 {
        debug_assert!(inline.len() <= INLINE_BYTES);
        self.step += 1;
        let step = self.step;
        let me = self.me;
        let at = self.flag_offset(step);
        self.word(me, at + 8).store(self.stamp, Ordering::Relaxed);
        // SAFETY: the payload bytes follow the step and signature words inside this rank's
        // own flag entry, which no peer reads until the step number below is stored (Release).
        unsafe {
            std::ptr::copy_nonoverlapping(
                inline.as_ptr(),
                self.regions[me].add(at + 16),
                inline.len(),
            )
        };
        // SeqCst, both: a waiter that announced it sleeps either sees these stores or is woken
        // (`ShmHost::wake` reads `sleepers` next). A Release store may still sit in the store
        // buffer (x86) when `sleepers` is read, and `prepare` waits on PROGRESS alone.
        self.word(me, at).store(step, Ordering::SeqCst);
        self.word(me, PROGRESS).store(step, Ordering::SeqCst);
        self.known[me] = step;
        step
    }

    /// Whether local rank `p` has published the current step, and whether for this
    /// rank's collective.
    pub fn arrived(&mut self, p: usize) -> Arrival {
        let at = self.flag_offset(self.step);
        let seen = self.word(p, at).load(Ordering::Acquire);
        if seen < self.step {
            return Arrival::Pending;
        }
        self.known[p] = self.known[p].max(self.step);
        if seen == self.step && self.word(p, at + 8).load(Ordering::Relaxed) != self.stamp {
            return Arrival::Mismatch;
        }
        Arrival::Arrived
    }

    /// Starts writing into local peers' published buffers in collective `seq`; every write
    /// checks [`Workspace::withdrawn`] first, and [`Workspace::end_writes`] follows.
    pub fn begin_writes(&self, seq: u64) {
        // SeqCst with `withdraw`'s: a peer that withdraws either is seen withdrawn by the
        // next check here or sees this and waits for `end_writes`.
        self.word(self.me, WRITING).store(seq + 1, Ordering::SeqCst);
    }

    /// Whether local rank `p` withdrew, in collective `seq`, the buffer it published.
    pub fn withdrawn(&self, p: usize, seq: u64) -> bool {
        self.word(p, WITHDRAWN).load(Ordering::SeqCst) > seq
    }

    /// Done writing into peers' buffers in collective `seq` (finished or given up).
    pub fn end_writes(&self, seq: u64) {
        self.word(self.me, WRITTEN)
            .store(seq + 1, Ordering::Release);
    }

    /// Withdraws the buffer this rank published in collective `seq` for local rank `writer`
    /// to write into (this rank failed; its caller may free the buffer): `writer` writes no
    /// more of it unless it had already begun, which this returns.
    pub fn withdraw(&self, seq: u64, writer: usize) -> bool {
        self.word(self.me, WITHDRAWN)
            .store(seq + 1, Ordering::SeqCst);
        self.word(writer, WRITING).load(Ordering::SeqCst) > seq
    }

    /// Whether local rank `writer` is done writing into peers' buffers in collective `seq`.
    pub fn writes_ended(&self, writer: usize, seq: u64) -> bool {
        self.word(writer, WRITTEN).load(Ordering::Acquire) > seq
    }

    /// Whether local rank `p`'s process may still write into this one: it exists and has
    /// not exited (a zombie has no memory left to write from).
    pub fn may_write_here(&self, p: usize) -> bool {
        self.pid(p).is_ok_and(cma::has_memory)
    }

    /// Whether local rank `p` has published the current step, without recording it.
    pub fn peek_arrived(&self, p: usize) -> bool {
        let at = self.flag_offset(self.step);
        self.word(p, at).load(Ordering::Acquire) >= self.step
    }

    /// The inline payload local rank `p` published with the current step.
    pub fn inline(&self, p: usize, len: usize) -> &[u8] {
        let at = self.flag_offset(self.step) + 16;
        // SAFETY: inside p's flag entry; stable until this rank publishes its next step (the
        // protocol: p does not overwrite it before this rank has published that).
        unsafe { std::slice::from_raw_parts(self.regions[p].add(at), len.min(INLINE_BYTES)) }
    }

    /// Where in its slot step `step` keeps `len` bytes published whole.
    fn data_offset(step: u64, len: usize) -> usize {
        if len <= ROTATED_MAX_BYTES {
            (step / 2 % 2) as usize * (SLOT_BYTES / 2)
        } else {
            0
        }
    }

    /// This rank's `len` bytes (at most [`SLOT_BYTES`]) of the next step, published whole,
    /// in its slot (see [`ROTATED_MAX_BYTES`]; a whole slot is the slot). Only valid after
    /// [`Workspace::may_write`] said yes for a slot (the caller waits for that first).
    pub fn next_data(&mut self, len: usize) -> &mut [u8] {
        let at = Self::data_offset(self.step + 1, len);
        &mut self.next_slot()[at..at + len]
    }

    /// Local rank `p`'s `len` bytes of the current step, published whole with
    /// [`Workspace::next_data`].
    pub fn data(&self, p: usize, len: usize) -> &[u8] {
        let at = Self::data_offset(self.step, len);
        &self.slot(p)[at..at + len]
    }

    /// Local rank `p`'s data slot of the current step.
    pub fn slot(&self, p: usize) -> &[u8] {
        let at = SLOTS + (self.step % 2) as usize * SLOT_BYTES;
        // SAFETY: inside p's region; stable until this rank publishes its next step.
        unsafe { std::slice::from_raw_parts(self.regions[p].add(at), SLOT_BYTES) }
    }
}
