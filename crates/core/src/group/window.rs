//! One-sided windows on a [`ProcessGroup`] (torch's `Window`). Registering is collective: each
//! rank's [`WindowMemory`] is made and its name and size gathered. Where every rank shares one
//! host (UNIFIED access) the peers' memories are mapped and a put is a copy into them; elsewhere
//! (SEPARATE access: other hosts, or `RUSTDIST_SHM=0`) a put or a signal is a frame the
//! target's engine applies (`transport/mesh/window.rs`). `put`, `signal` and `wait_signal` run
//! in issue order with the group's other operations, are recorded by its flight recorder, and
//! complete a Work.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::worker::lock;
use super::{ProcessGroup, Run};
use crate::error::{Error, Result};
use crate::recorder::Op;
use crate::tensor::{RawBuf, Tensor};
use crate::transport::window::WindowMemory;
use crate::transport::{LinkKind, WindowFrame};
use crate::types::DType;
use crate::work::Work;

/// Bytes each rank contributes to the registration's all_gather: its memory's name (NUL
/// padded), its size, then the caller's metadata (a length byte and the bytes).
const RECORD: usize = 256;
const NAME: usize = 64;
/// The most metadata bytes a rank may attach to its registration.
pub const META_BYTES: usize = RECORD - NAME - 8 - 1;
/// The largest synchronous put over the links that is copied and queued rather than written
/// and waited for: it then leaves in one write with the signal that follows it.
const EAGER_PUT_MAX: usize = 16 << 10;

/// A registered window: the memories mapped here (every rank's with UNIFIED access, this
/// rank's alone with SEPARATE), and what this rank has waited for.
pub struct Window {
    memories: Vec<Option<Arc<WindowMemory>>>,
    /// Bytes each rank registered.
    sizes: Vec<usize>,
    /// The transport's id of the window when its frames travel on the links (SEPARATE).
    on_links: Option<u32>,
    /// Signals from each rank that this rank's `wait_signal` calls have asked for so far.
    awaited: Vec<AtomicU64>,
    deregistered: AtomicBool,
}

impl Window {
    /// Rank `rank`'s registered bytes, mapped into this process: this rank's own always, a
    /// peer's only with UNIFIED access.
    pub fn memory(&self, rank: usize) -> Option<&Arc<WindowMemory>> {
        self.memories[rank].as_ref()
    }

    /// How many bytes rank `rank` registered.
    pub fn bytes(&self, rank: usize) -> usize {
        self.sizes[rank]
    }

    /// Whether peers reach each other's memory directly (UNIFIED) rather than by frames on the
    /// links (SEPARATE).
    pub fn unified(&self) -> bool {
        self.on_links.is_none()
    }

    fn check_open(&self) -> Result<()> {
        if self.deregistered.load(Ordering::Acquire) {
            return Err(Error::invalid(
                "the window's tensor was deregistered (tensor_deregister): register one again",
            ));
        }
        Ok(())
    }
}

fn window_op(name: &'static str, numel: usize, dtype: DType, src: usize, dst: usize) -> Op {
    Op {
        name,
        input: numel as u64,
        output: numel as u64,
        dtype,
        p2p: Some((src, dst)),
        cuda: false,
    }
}

/// A name no other window memory on this host has.
fn memory_name() -> String {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "/rustdist-w-{}-{}-{stamp:x}",
        std::process::id(),
        MADE.fetch_add(1, Ordering::Relaxed)
    )
}

impl ProcessGroup {
    /// Whether the group can hold windows: every group can (UNIFIED access on one host with
    /// shared memory, SEPARATE elsewhere).
    pub fn supports_window(&self) -> bool {
        true
    }

    /// Whether this group's windows map every rank's memory (UNIFIED access).
    fn windows_unified(&self) -> bool {
        self.size == 1 || self.link == LinkKind::SharedMemory
    }

    /// Registers `initial.len()` bytes of window memory on every rank, holding `initial`
    /// (collective, in the same order on all: no peer puts before every rank's values are
    /// in); returns the window and each rank's `meta` (at most [`META_BYTES`]).
    pub fn register_window(&self, initial: &[u8], meta: &[u8]) -> Result<(Window, Vec<Vec<u8>>)> {
        let bytes = initial.len();
        let unified = self.windows_unified();
        if meta.len() > META_BYTES {
            return Err(Error::invalid(format!(
                "window metadata of {} bytes (at most {META_BYTES})",
                meta.len()
            )));
        }
        let name = memory_name();
        let own = WindowMemory::create(&name, self.size, bytes);
        let mut record = vec![0u8; RECORD];
        if let Ok(own) = &own {
            // SAFETY: the memory holds `bytes` registered bytes; nobody else has mapped it yet.
            unsafe { own.write(0, initial.as_ptr(), bytes, self.rank) }?;
            record[..name.len()].copy_from_slice(name.as_bytes());
        }
        record[NAME..NAME + 8].copy_from_slice(&(bytes as u64).to_le_bytes());
        record[NAME + 8] = meta.len() as u8;
        record[NAME + 9..NAME + 9 + meta.len()].copy_from_slice(meta);
        let mut gathered = vec![0u8; RECORD * self.size];
        let outputs = gathered
            .chunks_mut(RECORD)
            .map(RawBuf::from_mut_slice)
            .collect();
        // SAFETY: `record` lives, untouched, until the synchronous all_gather returns.
        let input = unsafe { Tensor::new(record.as_mut_ptr(), DType::U8, RECORD) };
        self.all_gather(input, outputs, Run::Sync)?;
        let mut own = Some(own?);
        let failed = gathered.chunks(RECORD).position(|r| r[0] == 0);
        if let Some(r) = failed {
            return Err(Error::backend(format!(
                "rank {r} could not make its window memory (is /dev/shm full?)"
            )));
        }
        let mut memories = Vec::with_capacity(self.size);
        let mut sizes = Vec::with_capacity(self.size);
        let mut metas = Vec::with_capacity(self.size);
        for (r, rec) in gathered.chunks(RECORD).enumerate() {
            let len = rec[..NAME].iter().position(|&b| b == 0).unwrap_or(NAME);
            let peer_name = String::from_utf8_lossy(&rec[..len]);
            let mut size = [0u8; 8];
            size.copy_from_slice(&rec[NAME..NAME + 8]);
            let size = u64::from_le_bytes(size) as usize;
            let meta_len = rec[NAME + 8] as usize;
            metas.push(rec[NAME + 9..NAME + 9 + meta_len].to_vec());
            sizes.push(size);
            memories.push(match own.take_if(|_| r == self.rank) {
                Some(mine) => Some(mine),
                None if unified => Some(WindowMemory::open(&peer_name, self.size, size)?),
                None => None,
            });
        }
        if !unified {
            // Nobody else maps it.
            for memory in memories.iter_mut().flatten() {
                memory.unlink();
            }
        }
        let mut memories: Vec<Option<Arc<WindowMemory>>> =
            memories.into_iter().map(|m| m.map(Arc::new)).collect();
        let on_links = match unified {
            true => None,
            false => Some(self.attach_window(memories[self.rank].clone())?),
        };
        // Every rank has mapped every memory (or takes frames for its own): the names can go
        // (nothing is left in /dev/shm), and peers may put.
        self.barrier(Run::Sync)?;
        if unified {
            for memory in memories.iter_mut().flatten() {
                if let Some(memory) = Arc::get_mut(memory) {
                    memory.unlink();
                }
            }
        }
        let window = Window {
            memories,
            sizes,
            on_links,
            awaited: (0..self.size).map(|_| AtomicU64::new(0)).collect(),
            deregistered: AtomicBool::new(false),
        };
        Ok((window, metas))
    }

    /// Has the transport take frames for this rank's window `own`; returns its id there.
    fn attach_window(&self, own: Option<Arc<WindowMemory>>) -> Result<u32> {
        let own =
            own.ok_or_else(|| Error::Runtime("this rank's window memory is missing".into()))?;
        let id = Arc::new(OnceLock::new());
        let made = id.clone();
        self.start(Run::Sync, "register_window", None, move |eng| {
            let _ = made.set(eng.transport.attach_window(own)?);
            Ok(None)
        })?;
        // Attached on this thread, perhaps: the worker must start reading the links.
        self.shared.queue.nudge();
        id.get()
            .copied()
            .ok_or_else(|| Error::Runtime("the window was not attached".into()))
    }

    fn own_memory(&self, window: &Window) -> Result<Arc<WindowMemory>> {
        window.memories[self.rank]
            .clone()
            .ok_or_else(|| Error::Runtime("this rank's window memory is missing".into()))
    }

    /// Ends the window's registration on every rank (collective): puts into it fail after.
    /// Over the links, every put and signal a peer issued before it has landed by then.
    pub fn deregister_window(&self, window: &Window) -> Result<()> {
        window.check_open()?;
        window.deregistered.store(true, Ordering::Release);
        let own = self.own_memory(window)?;
        let closed = match window.on_links {
            Some(id) => self
                .start(Run::Sync, "deregister_window", None, move |eng| {
                    let deadline = eng.deadline();
                    eng.transport.close_window(id, deadline)?;
                    Ok(None)
                })
                .map(drop),
            None => self.barrier(Run::Sync).map(drop),
        };
        // Only now: a put a peer issued before its own deregister (still on the way, or run
        // by its worker) lands rather than fail.
        own.close();
        closed
    }

    /// Sends a window frame to `dst` over the links; complete once the frame has left this
    /// rank (a synchronous call on an idle group does it all on the caller's thread).
    fn post_window_frame(
        &self,
        id: u32,
        op: Op,
        dst: usize,
        frame: WindowFrame,
        mode: Run,
    ) -> Result<Option<Work>> {
        self.start(mode, op.name, Some(op), move |eng| {
            eng.check()?;
            let deadline = eng.deadline();
            let outcome = Arc::new(Mutex::new(None));
            let slot = outcome.clone();
            let done = Box::new(move |sent| *lock(&slot) = Some(sent));
            eng.transport.post_window(dst, id, frame, deadline, done);
            // A small put copied and queued is done at once: it leaves with the next frame to
            // `dst` (the signal after it), or in the worker's next round.
            if let Some(sent) = lock(&outcome).take() {
                return sent.map(|_| None);
            }
            let sent = || lock(&outcome).is_some();
            let what = format!("{} to rank {dst}", op.name);
            eng.transport.wait_window(dst, &sent, deadline, &what)?;
            let sent = lock(&outcome).take();
            sent.unwrap_or_else(|| Err(Error::Runtime(format!("{what} vanished"))))?;
            Ok(None)
        })
    }

    /// Copies `src` into rank `dst`'s window at byte `offset`.
    pub fn window_put(
        &self,
        window: &Window,
        src: Tensor,
        dst: usize,
        offset: usize,
        mode: Run,
    ) -> Result<Option<Work>> {
        self.check_rank("put destination rank", dst)?;
        window.check_open()?;
        let recorded = window_op("put", src.numel, src.dtype, self.rank, dst);
        let Some(target) = window.memories[dst].clone() else {
            let (len, room) = (src.nbytes(), window.sizes[dst]);
            if offset.checked_add(len).is_none_or(|end| end > room) {
                return Err(Error::invalid(format!(
                    "a put of {len} bytes at byte {offset} does not fit rank {dst}'s window of {room} bytes"
                )));
            }
            let put = WindowFrame::Put {
                offset: offset as u64,
                data: src.buf,
                eager: matches!(mode, Run::Sync) && len <= EAGER_PUT_MAX,
            };
            let id = window.on_links.unwrap_or_default();
            return self.post_window_frame(id, recorded, dst, put, mode);
        };
        self.start(mode, "put", Some(recorded), move |eng| {
            eng.check()?;
            // SAFETY: the caller keeps `src` alive and unchanged until the operation completes.
            unsafe { target.write(offset, src.buf.as_mut_ptr(), src.nbytes(), dst) }?;
            Ok(None)
        })
    }

    /// Signals rank `dst`: after every put this rank issued before it.
    pub fn window_signal(&self, window: &Window, dst: usize, mode: Run) -> Result<Option<Work>> {
        self.check_rank("signal destination rank", dst)?;
        window.check_open()?;
        let me = self.rank;
        let recorded = window_op("signal", 0, DType::U8, me, dst);
        let Some(target) = window.memories[dst].clone() else {
            let id = window.on_links.unwrap_or_default();
            return self.post_window_frame(id, recorded, dst, WindowFrame::Signal, mode);
        };
        self.start(mode, "signal", Some(recorded), move |eng| {
            eng.check()?;
            target.signal(me);
            Ok(None)
        })
    }

    /// Waits for the next signal from rank `src` (within `timeout`, else the group's); the
    /// puts that rank issued before it are then visible here.
    pub fn window_wait_signal(
        &self,
        window: &Window,
        src: usize,
        timeout: Option<Duration>,
        mode: Run,
    ) -> Result<Option<Work>> {
        self.check_rank("wait_signal source rank", src)?;
        window.check_open()?;
        let own = self.own_memory(window)?;
        let on_links = window.on_links.is_some();
        let count = window.awaited[src].fetch_add(1, Ordering::AcqRel) + 1;
        let recorded = window_op("wait_signal", 0, DType::U8, src, self.rank);
        self.start(mode, "wait_signal", Some(recorded), move |eng| {
            let deadline = timeout.map_or_else(|| eng.deadline(), |t| Instant::now() + t);
            if on_links {
                // The engine reads the links meanwhile: the signal arrives as a frame.
                eng.check()?;
                let arrived = || own.signals_from(src) >= count;
                let what = format!("wait_signal for rank {src}'s signal");
                eng.transport.wait_window(src, &arrived, deadline, &what)?;
                return Ok(None);
            }
            let health = || {
                eng.check()?;
                eng.cancel.check()
            };
            own.wait(src, count, deadline, &health)?;
            Ok(None)
        })
    }
}
