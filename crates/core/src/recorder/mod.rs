//! The flight recorder: every group keeps its last operations (collectives and point-to-point)
//! in a bounded ring, each with its sequence numbers, sizes, dtype, state (scheduled, started,
//! completed) and timestamps, and, when asked for (`TORCH_INCLUDE_STACK_TRACE`), the Python
//! stack that issued it. A dump (`dump.rs`) writes every group of the process in the pickle
//! format torch's flight recorder writes, which torch's analyzer (`fr_trace`) reads; the
//! heartbeats carry what each rank is doing (`status`), so that a timeout can say what the
//! ranks that never arrived were doing instead.
//!
//! The ring is sized by `TORCH_FR_BUFFER_SIZE` (torch's variable; `TORCH_NCCL_TRACE_BUFFER_SIZE`
//! before it), default [`DEFAULT_ENTRIES`], 0 turning recording off. An operation costs two
//! uncontended lock acquisitions and two clock reads: recording stays on.

mod dump;
mod snapshot;
mod stats;

#[cfg(test)]
use dump::write_dump;
pub use dump::{dump, dump_after_failure, dump_path};
pub use snapshot::{snapshot, GroupState, OpState, ProcessState};
pub use stats::{note_algorithm, GroupStats, OpCounts};

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use crate::types::DType;

/// Entries kept per group when `TORCH_FR_BUFFER_SIZE` is unset.
pub const DEFAULT_ENTRIES: usize = 128;

/// One frame of the Python stack that issued an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub name: String,
    pub filename: String,
    pub line: u32,
}

/// What an operation is, as the recorder keeps it.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    /// torch's name of the operation (`all_reduce`, `_allgather_base`, `send`, ...).
    pub name: &'static str,
    /// Elements read and written (the whole input and output, however many tensors).
    pub input: u64,
    pub output: u64,
    pub dtype: DType,
    /// A point-to-point operation's (source, destination) group ranks; `None` for a
    /// collective. A receive from any source has no source (`usize::MAX`).
    pub p2p: Option<(usize, usize)>,
    /// Runs on NCCL (CUDA tensors), else on the CPU engine.
    pub cuda: bool,
}

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Scheduled,
    Started,
    Completed,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Scheduled => "scheduled",
            State::Started => "started",
            State::Completed => "completed",
        }
    }
}

/// One recorded operation.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    record_id: u64,
    collective_seq: u64,
    p2p_seq: u64,
    op_id: u64,
    op: Op,
    created_ns: u64,
    started_ns: Option<u64>,
    completed_ns: Option<u64>,
    state: State,
    /// It failed (it keeps the state it failed in, as torch's dumps do).
    failed: bool,
    timeout_ms: u64,
    frames: Option<Arc<Vec<Frame>>>,
    thread: Arc<(String, u64)>,
}

/// The group's name, description and members, as torch's dumps name them.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupInfo {
    pub(crate) name: String,
    pub(crate) desc: String,
    /// Global ranks of the members, by group rank.
    pub(crate) ranks: Vec<usize>,
}

struct Ring {
    slots: Vec<Option<Entry>>,
    /// Entries ever recorded; the next one goes to `recorded % slots.len()`.
    recorded: u64,
    /// The group's counters (kept even when recording is off).
    counts: stats::Counts,
}

impl Ring {
    /// Entry `index`, unless the ring has gone round and overwritten it.
    fn live(&mut self, index: u64) -> Option<&mut Entry> {
        let cap = self.slots.len() as u64;
        (self.recorded - index <= cap)
            .then(|| self.slots[(index % cap) as usize].as_mut())
            .flatten()
    }
}

/// A handle on a recorded operation, to mark it started and completed.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    /// The entry's number in its recorder (`None`: recording is off).
    index: Option<u64>,
}

/// The flight recorder of one group.
pub struct Recorder {
    pg_id: u64,
    /// The id of the group in frame headers and heartbeats (None: a CUDA group, which has
    /// neither).
    group: Option<u32>,
    info: Mutex<GroupInfo>,
    ring: Mutex<Ring>,
    collective_seq: AtomicU64,
    p2p_seq: AtomicU64,
    op_id: AtomicU64,
    /// The last collective this rank entered (started) on the group.
    entered: AtomicU64,
    /// Left out of dumps and of what the process is doing: a group only rustdist uses inside
    /// (the staging group of a CUDA group, whose steps its CUDA group records).
    hidden: std::sync::atomic::AtomicBool,
    /// The group has ended (destroyed, shrunk, aborted): kept for dumps, not a live group.
    ended: std::sync::atomic::AtomicBool,
}

/// What a rank tells its peers of a group in its heartbeats (see [`status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The last collective it entered on the group.
    pub entered: u64,
    /// Its latest operation on any group, in words ("broadcast #17 of group 'tp' (started)").
    pub activity: String,
    /// How long ago that operation was issued, in milliseconds.
    pub age_ms: u64,
}

/// The longest activity text a heartbeat carries.
pub const MAX_ACTIVITY: usize = 200;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep using it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every recorder of the process (the dump writes them all), and the ids shared by them.
static RECORDERS: Mutex<Vec<Weak<Recorder>>> = Mutex::new(Vec::new());
/// The recorders of the last groups that ended (destroyed, shrunk, aborted), kept alive for
/// the dumps written after: the survivors of a shrink dump the group that failed.
static RETIRED: Mutex<VecDeque<Arc<Recorder>>> = Mutex::new(VecDeque::new());
/// Ended groups whose recorders are kept.
const RETIRED_KEPT: usize = 8;
static RECORD_IDS: AtomicU64 = AtomicU64::new(0);
static PG_IDS: AtomicU64 = AtomicU64::new(0);
/// This process's global rank, which names its dump file (-1 until the world says).
static GLOBAL_RANK: AtomicI64 = AtomicI64::new(-1);

thread_local! {
    /// The stack the next operation issued on this thread was called from (set by the
    /// binding when stacks are asked for).
    static NEXT_FRAMES: RefCell<Option<Arc<Vec<Frame>>>> = const { RefCell::new(None) };
    static THREAD: Arc<(String, u64)> = Arc::new((
        std::thread::current().name().unwrap_or("unnamed").to_string(),
        // The system call, not glibc's gettid(): that wrapper came in glibc 2.30, and the
        // manylinux2014 wheels must load on 2.17.
        // SAFETY: SYS_gettid takes no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) } as u64,
    ));
}

/// Entries per group: `TORCH_FR_BUFFER_SIZE`, else `TORCH_NCCL_TRACE_BUFFER_SIZE`, else the
/// default; read once.
pub fn capacity() -> usize {
    static CAPACITY: OnceLock<usize> = OnceLock::new();
    *CAPACITY.get_or_init(|| {
        ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"]
            .iter()
            .find_map(|v| std::env::var(v).ok())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_ENTRIES)
    })
}

/// Sets this process's global rank (the dump file's suffix).
pub fn set_global_rank(rank: usize) {
    GLOBAL_RANK.store(rank as i64, Ordering::Release);
}

pub(crate) fn global_rank() -> i64 {
    GLOBAL_RANK.load(Ordering::Acquire)
}

/// Makes `frames` the stack of the next operation this thread issues.
pub fn set_next_frames(frames: Vec<Frame>) {
    NEXT_FRAMES.with(|f| *f.borrow_mut() = Some(Arc::new(frames)));
}

/// Nanoseconds since the epoch (torch's timestamps).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// [`now_ns`] from the kernel's coarse clock (the last tick's time, a few milliseconds behind
/// at most) at a fifth of the cost: the hot path stamps every operation two or three times,
/// and what a recorder is read for (which operation, how long ago) needs no finer time.
fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_REALTIME_COARSE exists on Linux.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return now_ns();
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Keeps the recorder of a group that ended for later dumps (the last `RETIRED_KEPT` ones
/// that recorded anything).
pub fn retire(recorder: &Arc<Recorder>) {
    recorder.ended.store(true, Ordering::Relaxed);
    if recorder.hidden.load(Ordering::Relaxed) || lock(&recorder.ring).recorded == 0 {
        return;
    }
    let mut retired = lock(&RETIRED);
    retired.push_back(recorder.clone());
    while retired.len() > RETIRED_KEPT {
        retired.pop_front();
    }
}

/// The live recorders of the process (and the retired ones), oldest first, hidden ones left
/// out.
pub(crate) fn recorders() -> Vec<Arc<Recorder>> {
    let mut all = lock(&RECORDERS);
    all.retain(|w| w.strong_count() > 0);
    all.iter()
        .filter_map(Weak::upgrade)
        .filter(|r| !r.hidden.load(Ordering::Relaxed))
        .collect()
}

impl Recorder {
    /// The recorder of group `name` (id `group` in frame headers), registered for dumps. Its
    /// description and members are torch's defaults until [`Recorder::set_info`].
    pub fn new(name: &str, group: Option<u32>, size: usize) -> Arc<Recorder> {
        let cap = capacity();
        let recorder = Arc::new(Recorder {
            pg_id: PG_IDS.fetch_add(1, Ordering::Relaxed),
            group,
            info: Mutex::new(GroupInfo {
                name: name.to_string(),
                desc: "undefined".to_string(),
                ranks: (0..size).collect(),
            }),
            ring: Mutex::new(Ring {
                slots: vec![None; cap],
                recorded: 0,
                counts: stats::Counts::default(),
            }),
            collective_seq: AtomicU64::new(0),
            p2p_seq: AtomicU64::new(0),
            op_id: AtomicU64::new(0),
            entered: AtomicU64::new(0),
            hidden: std::sync::atomic::AtomicBool::new(false),
            ended: std::sync::atomic::AtomicBool::new(false),
        });
        lock(&RECORDERS).push(Arc::downgrade(&recorder));
        recorder
    }

    /// The group's name and description as torch knows them (`group_name`, `group_desc`)
    /// and its members' global ranks, by group rank.
    pub fn set_info(&self, name: &str, desc: &str, ranks: Vec<usize>) {
        let mut info = lock(&self.info);
        info.name = name.to_string();
        info.desc = desc.to_string();
        info.ranks = ranks;
    }

    pub(crate) fn info(&self) -> GroupInfo {
        lock(&self.info).clone()
    }

    /// Leaves the group out of dumps and activity (see `hidden`).
    pub fn hide(&self) {
        self.hidden.store(true, Ordering::Relaxed);
    }

    /// The description torch gives the group, else its name: how messages name it.
    pub fn label(&self) -> String {
        let info = lock(&self.info);
        if info.desc.is_empty() || info.desc == "undefined" {
            info.name.clone()
        } else {
            info.desc.clone()
        }
    }

    /// Records `op`, issued now with `timeout`; `started` when it runs at once.
    pub fn record(&self, op: Op, timeout: Duration, started: bool) -> Ticket {
        let frames = NEXT_FRAMES.with(|f| f.borrow_mut().take());
        let mut ring = lock(&self.ring);
        // Inputs, or a receive's buffer.
        let elements = if op.input == 0 { op.output } else { op.input };
        ring.counts
            .issued(op.name, elements * op.dtype.size() as u64);
        if ring.slots.is_empty() {
            return Ticket { index: None };
        }
        let (collective_seq, p2p_seq) = if op.p2p.is_some() {
            (
                self.collective_seq.load(Ordering::Relaxed),
                self.p2p_seq.fetch_add(1, Ordering::Relaxed) + 1,
            )
        } else {
            (
                self.collective_seq.fetch_add(1, Ordering::Relaxed) + 1,
                self.p2p_seq.load(Ordering::Relaxed),
            )
        };
        let created_ns = coarse_now_ns();
        let entry = Entry {
            record_id: RECORD_IDS.fetch_add(1, Ordering::Relaxed),
            collective_seq,
            p2p_seq,
            op_id: self.op_id.fetch_add(1, Ordering::Relaxed) + 1,
            op,
            created_ns,
            started_ns: started.then_some(created_ns),
            completed_ns: None,
            state: if started {
                State::Started
            } else {
                State::Scheduled
            },
            failed: false,
            timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
            frames,
            thread: THREAD.with(Arc::clone),
        };
        let index = ring.recorded;
        let cap = ring.slots.len() as u64;
        ring.slots[(index % cap) as usize] = Some(entry);
        ring.recorded += 1;
        drop(ring);
        if started && op.p2p.is_none() {
            self.entered.fetch_max(collective_seq, Ordering::Relaxed);
        }
        Ticket { index: Some(index) }
    }

    /// Marks the operation started (taken off the queue).
    pub fn started(&self, t: Ticket) {
        let mut entered = None;
        self.update(t, |e, now| {
            e.state = State::Started;
            e.started_ns = Some(now);
            if e.op.p2p.is_none() {
                entered = Some(e.collective_seq);
            }
        });
        if let Some(seq) = entered {
            self.entered.fetch_max(seq, Ordering::Relaxed);
        }
    }

    /// Marks the operation completed (successfully: a failed one stays where it was).
    pub fn completed(&self, t: Ticket) {
        self.update(t, |e, now| {
            e.state = State::Completed;
            e.completed_ns = Some(now);
        });
    }

    fn update(&self, t: Ticket, f: impl FnOnce(&mut Entry, u64)) {
        let Some(index) = t.index else { return };
        let now = coarse_now_ns();
        if let Some(e) = lock(&self.ring).live(index) {
            f(e, now);
        }
    }

    /// The entries still in the ring, oldest first.
    pub(crate) fn entries(&self) -> Vec<Entry> {
        let ring = lock(&self.ring);
        let cap = ring.slots.len() as u64;
        let first = ring.recorded.saturating_sub(cap);
        (first..ring.recorded)
            .filter_map(|i| ring.slots[(i % cap) as usize].clone())
            .collect()
    }

    /// An operation this thread has just run: counts the algorithm the dispatcher noted for
    /// it (if any) and the time its transport waited for peers, and marks it completed when
    /// it `succeeded` (a failed one stays where it was); one lock for all of it.
    pub fn ran(&self, t: Option<Ticket>, succeeded: bool, waited: Duration) {
        let now = coarse_now_ns();
        let mut ring = lock(&self.ring);
        ring.counts.ran(waited);
        if let Some(e) = t.and_then(|t| t.index).and_then(|index| ring.live(index)) {
            if succeeded {
                e.state = State::Completed;
                e.completed_ns = Some(now);
            } else {
                e.failed = true;
            }
        }
    }

    /// The group's counters.
    pub fn stats(&self) -> GroupStats {
        lock(&self.ring).counts.report()
    }

    /// The sequence number of the last collective issued on the group (0 before any).
    pub fn collective_seq(&self) -> u64 {
        self.collective_seq.load(Ordering::Relaxed)
    }

    /// The last collective this rank entered (started) on the group (0 before any).
    pub fn entered(&self) -> u64 {
        self.entered.load(Ordering::Relaxed)
    }

    /// The latest entry, for what this rank is doing.
    pub(crate) fn latest(&self) -> Option<Entry> {
        let ring = lock(&self.ring);
        let cap = ring.slots.len() as u64;
        (ring.recorded > 0 && cap > 0)
            .then(|| ring.slots[((ring.recorded - 1) % cap) as usize].clone())
            .flatten()
    }
}

/// What this process is doing, in words: its latest operation on any group ("broadcast #17 of
/// group 'tp' (started)"), and how long ago it was issued; None before any.
pub fn activity() -> Option<(String, Duration)> {
    let (recorder, e) = recorders()
        .into_iter()
        .filter_map(|r| r.latest().map(|e| (r, e)))
        .max_by_key(|(_, e)| e.record_id)?;
    let seq = if e.op.p2p.is_some() {
        e.p2p_seq
    } else {
        e.collective_seq
    };
    let mut text = format!(
        "{} #{seq} of group '{}' ({})",
        e.op.name,
        recorder.label(),
        e.state.name()
    );
    if text.len() > MAX_ACTIVITY {
        let mut end = MAX_ACTIVITY;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    let age = Duration::from_nanos(coarse_now_ns().saturating_sub(e.created_ns));
    Some((text, age))
}

/// The live recorder of the group with id `group` (the newest, should two share it).
fn find(group: u32) -> Option<Arc<Recorder>> {
    recorders()
        .into_iter()
        .rev()
        .find(|r| r.group == Some(group))
}

/// What this process tells its peers of group `group` in a heartbeat: the last collective it
/// entered there, and what it is doing.
pub fn status(group: u32) -> Status {
    let entered = find(group).map_or(0, |r| r.entered());
    let (activity, age) = activity().unwrap_or_else(|| ("nothing yet".into(), Duration::ZERO));
    Status {
        entered,
        activity,
        age_ms: age.as_millis().min(u64::MAX as u128) as u64,
    }
}

/// The global rank of rank `rank` of the live group with id `group`, when the front door has
/// said (see [`Recorder::set_info`]).
pub fn global_rank_of(group: u32, rank: usize) -> Option<usize> {
    find(group).and_then(|r| r.info().ranks.get(rank).copied())
}

/// How messages name the live group with id `group` (see [`Recorder::label`]).
pub fn label(group: u32) -> Option<String> {
    find(group).map(|r| r.label())
}

#[cfg(test)]
mod tests;
