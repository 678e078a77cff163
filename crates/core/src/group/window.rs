//! One-sided windows on a [`ProcessGroup`] whose ranks share one host (torch's `Window`,
//! UNIFIED access): registering is collective (each rank's [`WindowMemory`] is made, its name
//! gathered, the peers' mapped); `put`, `signal` and `wait_signal` run in issue order with the
//! group's other operations, are recorded by its flight recorder, and complete a Work.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ProcessGroup, Run};
use crate::error::{Error, Result};
use crate::recorder::Op;
use crate::tensor::{RawBuf, Tensor};
use crate::transport::window::WindowMemory;
use crate::transport::LinkKind;
use crate::types::DType;
use crate::work::Work;

/// Bytes each rank contributes to the registration's all_gather: its memory's name (NUL
/// padded), its size, then the caller's metadata (a length byte and the bytes).
const RECORD: usize = 256;
const NAME: usize = 64;
/// The most metadata bytes a rank may attach to its registration.
pub const META_BYTES: usize = RECORD - NAME - 8 - 1;

/// A registered window: every rank's memory, mapped here, and what this rank has waited for.
pub struct Window {
    memories: Vec<Arc<WindowMemory>>,
    /// Signals from each rank that this rank's `wait_signal` calls have asked for so far.
    awaited: Vec<AtomicU64>,
    deregistered: AtomicBool,
}

impl Window {
    /// Rank `rank`'s registered bytes, mapped into this process.
    pub fn memory(&self, rank: usize) -> &Arc<WindowMemory> {
        &self.memories[rank]
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
    /// Whether the group can hold windows: every rank on this host with shared memory.
    pub fn supports_window(&self) -> bool {
        self.size == 1 || self.link == LinkKind::SharedMemory
    }

    /// Registers `initial.len()` bytes of window memory on every rank, holding `initial`
    /// (collective, in the same order on all: no peer puts before every rank's values are
    /// in); returns the window and each rank's `meta` (at most [`META_BYTES`]).
    pub fn register_window(&self, initial: &[u8], meta: &[u8]) -> Result<(Window, Vec<Vec<u8>>)> {
        let bytes = initial.len();
        if !self.supports_window() {
            return Err(Error::invalid(format!(
                "one-sided windows need every rank of the group on one host with shared memory \
                 (UNIFIED access); this group's ranks reach each other over {} \
                 (windows across hosts are not supported yet)",
                self.link.name()
            )));
        }
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
        let mut metas = Vec::with_capacity(self.size);
        for (r, rec) in gathered.chunks(RECORD).enumerate() {
            let len = rec[..NAME].iter().position(|&b| b == 0).unwrap_or(NAME);
            let peer_name = String::from_utf8_lossy(&rec[..len]);
            let mut size = [0u8; 8];
            size.copy_from_slice(&rec[NAME..NAME + 8]);
            let size = u64::from_le_bytes(size) as usize;
            let meta_len = rec[NAME + 8] as usize;
            metas.push(rec[NAME + 9..NAME + 9 + meta_len].to_vec());
            memories.push(match own.take_if(|_| r == self.rank) {
                Some(mine) => mine,
                None => WindowMemory::open(&peer_name, self.size, size)?,
            });
        }
        // Every rank has mapped every memory: the names can go (nothing is left in /dev/shm).
        self.barrier(Run::Sync)?;
        for memory in &mut memories {
            memory.unlink();
        }
        let window = Window {
            memories: memories.into_iter().map(Arc::new).collect(),
            awaited: (0..self.size).map(|_| AtomicU64::new(0)).collect(),
            deregistered: AtomicBool::new(false),
        };
        Ok((window, metas))
    }

    /// Ends the window's registration on every rank (collective): puts into it fail after.
    pub fn deregister_window(&self, window: &Window) -> Result<()> {
        window.check_open()?;
        window.deregistered.store(true, Ordering::Release);
        window.memories[self.rank].close();
        self.barrier(Run::Sync)?;
        Ok(())
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
        let target = window.memories[dst].clone();
        let recorded = window_op("put", src.numel, src.dtype, self.rank, dst);
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
        let target = window.memories[dst].clone();
        let me = self.rank;
        let recorded = window_op("signal", 0, DType::U8, me, dst);
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
        let own = window.memories[self.rank].clone();
        let count = window.awaited[src].fetch_add(1, Ordering::AcqRel) + 1;
        let recorded = window_op("wait_signal", 0, DType::U8, src, self.rank);
        self.start(mode, "wait_signal", Some(recorded), move |eng| {
            let deadline = timeout.map_or_else(|| eng.deadline(), |t| Instant::now() + t);
            let health = || {
                eng.check()?;
                eng.cancel.check()
            };
            own.wait(src, count, deadline, &health)?;
            Ok(None)
        })
    }
}
