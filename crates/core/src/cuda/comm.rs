//! An NCCL communicator: non-blocking init and split bounded by the group's timeout, grouped
//! launches, async-error polling, abort and finalize.
//!
//! The communicator is non-blocking (`config.blocking = 0`), so no NCCL call can hang a thread:
//! calls return `ncclInProgress` and the state is polled with `ncclCommGetAsyncError` until it
//! settles or the deadline passes (then the communicator is aborted). Every use holds `raw`'s
//! lock (NCCL communicators are not thread-safe), released between polls so that the watchdog
//! can abort meanwhile; an aborted communicator is NULL and refuses further use.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustdist_nccl_sys::{
    Nccl, NcclComm, NcclConfig, NcclRedOp, NcclResult, NcclScalarResidence, NcclUniqueId,
    NCCL_SHRINK_ABORT, NCCL_SHRINK_DEFAULT, NCCL_SPLIT_NOCOLOR,
};

use super::codes::{self, OpSpec};
use crate::error::{Error, Result};
use crate::timeout::Timeout;

pub(crate) struct Comm {
    nccl: &'static Nccl,
    raw: Mutex<NcclComm>,
    /// Bounds each call's settling; the group may change it (see [`Comm::set_timeout`]).
    timeout: Timeout,
    /// Set once shrunk: NCCL then wants the communicator released by abort only (a rank that
    /// destroys it while another has aborted it hangs in a bootstrap barrier).
    shrunk: AtomicBool,
}

// SAFETY: the handle is only used under `raw`'s lock; NCCL allows a communicator to be used
// (one call at a time) from any thread.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// A non-blocking configuration (NCCL_CONFIG_INITIALIZER with `blocking = 0`).
fn config() -> NcclConfig {
    NcclConfig {
        blocking: 0,
        ..NcclConfig::default()
    }
}

impl Comm {
    /// Joins the communicator of `size` ranks that `id` names; bounded by `timeout`.
    pub(crate) fn init(
        nccl: &'static Nccl,
        rank: usize,
        size: usize,
        id: NcclUniqueId,
        timeout: Duration,
    ) -> Result<Comm> {
        let mut raw: NcclComm = std::ptr::null_mut();
        let (r, call) = match nccl.comm_init_rank_config {
            Some(init) => {
                let mut cfg = config();
                // SAFETY: `raw` and `cfg` are valid for the call; NCCL copies the config.
                let r = unsafe { init(&mut raw, size as c_int, id, rank as c_int, &mut cfg) };
                (r, "ncclCommInitRankConfig")
            }
            // NCCL < 2.14 has no non-blocking init: it blocks until every rank has joined.
            // SAFETY: `raw` is a valid out-pointer.
            None => (
                unsafe { (nccl.comm_init_rank)(&mut raw, size as c_int, id, rank as c_int) },
                "ncclCommInitRank",
            ),
        };
        let comm = Comm {
            nccl,
            raw: Mutex::new(raw),
            timeout: Timeout::new(timeout),
            shrunk: AtomicBool::new(false),
        };
        if r != NcclResult::IN_PROGRESS {
            // SAFETY: `raw` is NULL or the communicator just created.
            unsafe { nccl.check_comm(r, call, raw) }?;
        }
        comm.settle(call, Instant::now() + timeout)?;
        Ok(comm)
    }

    /// Bounds the calls made after this one (the group's timeout changed).
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    fn lock(&self) -> MutexGuard<'_, NcclComm> {
        self.raw.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live handle, or the error of using an aborted or destroyed communicator.
    fn live(guard: &MutexGuard<'_, NcclComm>) -> Result<NcclComm> {
        if guard.is_null() {
            return Err(Error::backend(
                "the NCCL communicator was aborted or destroyed",
            ));
        }
        Ok(**guard)
    }

    /// The communicator's state: `Ok(true)` while an operation is still being set up
    /// (ncclInProgress), `Ok(false)` when idle, or its asynchronous error.
    fn state(&self, call: &'static str) -> Result<bool> {
        let guard = self.lock();
        let raw = Self::live(&guard)?;
        let mut state = NcclResult::SUCCESS;
        // SAFETY: `raw` is live (we hold its lock) and `state` is a valid out-pointer.
        let r = unsafe { (self.nccl.comm_get_async_error)(raw, &mut state) };
        // SAFETY: as above.
        unsafe { self.nccl.check_comm(r, "ncclCommGetAsyncError", raw) }?;
        if state == NcclResult::IN_PROGRESS {
            return Ok(true);
        }
        // SAFETY: as above.
        unsafe { self.nccl.check_comm(state, call, raw) }?;
        Ok(false)
    }

    /// Polls until `call` has settled; past `deadline` the communicator is aborted.
    fn settle(&self, call: &'static str, deadline: Instant) -> Result<()> {
        let mut pause = Duration::from_micros(5);
        while self.state(call)? {
            if Instant::now() >= deadline {
                self.abort();
                return Err(Error::backend(format!(
                    "{call} did not complete within the group's timeout ({} ms); the NCCL \
                     communicator was aborted",
                    self.timeout.get().as_millis()
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The asynchronous error of the communicator, if it has one (for the watchdog).
    pub(crate) fn async_error(&self) -> Option<Error> {
        self.state("NCCL communicator").err()
    }

    /// Whether [`Comm::split`] can run (ncclCommSplit exists: NCCL >= 2.18).
    pub(crate) fn can_split(&self) -> bool {
        self.nccl.comm_split.is_some()
    }

    /// A new communicator of the ranks that pass the same `color` (None: this rank takes no
    /// part), ordered by `key`. Collective over this communicator's ranks; `Ok(None)` without
    /// ncclCommSplit (NCCL < 2.18), or for a rank without color.
    pub(crate) fn split(&self, color: Option<u32>, key: usize) -> Result<Option<Comm>> {
        let Some(split) = self.nccl.comm_split else {
            return Ok(None);
        };
        // NCCL stores the new handle from its own thread when the split completes, so the
        // slot lives on the heap and is leaked if we give up waiting for it.
        let slot: *mut NcclComm = Box::into_raw(Box::new(std::ptr::null_mut()));
        let mut cfg = config();
        let color = color.map_or(NCCL_SPLIT_NOCOLOR, |c| c as c_int);
        let started = {
            let guard = self.lock();
            Self::live(&guard).and_then(|raw| {
                // SAFETY: `raw` is live under its lock; `slot` and `cfg` are valid pointers
                // (NCCL copies the config before returning).
                let r = unsafe { split(raw, color, key as c_int, slot, &mut cfg) };
                if r == NcclResult::IN_PROGRESS {
                    return Ok(());
                }
                // SAFETY: as above.
                Ok(unsafe { self.nccl.check_comm(r, "ncclCommSplit", raw) }?)
            })
        };
        // A rank without color gets no communicator: the split is tracked by the parent.
        let settled = started
            .and_then(|()| self.settle("ncclCommSplit", Instant::now() + self.timeout.get()));
        // On an error NCCL may still write into `slot` (aborted or failed): it stays allocated.
        settled?;
        // SAFETY: allocated above; NCCL is done with it once the parent has settled.
        let child = *unsafe { Box::from_raw(slot) };
        if child.is_null() {
            return Ok(None);
        }
        let comm = Comm {
            nccl: self.nccl,
            raw: Mutex::new(child),
            timeout: Timeout::new(self.timeout.get()),
            shrunk: AtomicBool::new(false),
        };
        comm.settle("ncclCommSplit", Instant::now() + self.timeout.get())?;
        Ok(Some(comm))
    }

    /// Whether [`Comm::shrink`] can run (ncclCommShrink exists: NCCL >= 2.27).
    pub(crate) fn can_shrink(&self) -> bool {
        self.nccl.comm_shrink.is_some()
    }

    /// The communicator of this one's ranks but `excluded` (sorted), renumbered in order
    /// (ncclCommShrink, which the excluded ranks take no part in); `abort_pending` first aborts
    /// this one's pending operations (NCCL_SHRINK_ABORT). This communicator is released by
    /// abort only from here on ([`Comm::finalize`]).
    pub(crate) fn shrink(&self, excluded: &[usize], abort_pending: bool) -> Result<Comm> {
        let Some(shrink) = self.nccl.comm_shrink else {
            let (major, minor, patch) = self.nccl.loaded().version;
            return Err(Error::Runtime(format!(
                "shrinking a CUDA process group needs NCCL >= 2.27 (ncclCommShrink); the NCCL \
                 loaded ({}) is {major}.{minor}.{patch}",
                self.nccl.loaded().path.display()
            )));
        };
        // As for a split: NCCL stores the new handle from its own thread.
        let slot: *mut NcclComm = Box::into_raw(Box::new(std::ptr::null_mut()));
        let mut cfg = config();
        let mut list: Vec<c_int> = excluded.iter().map(|&r| r as c_int).collect();
        let flags = if abort_pending {
            NCCL_SHRINK_ABORT
        } else {
            NCCL_SHRINK_DEFAULT
        };
        self.shrunk.store(true, Ordering::Release);
        let started = {
            let guard = self.lock();
            let live = Self::live(&guard).map_err(|_| {
                Error::backend(
                    "the NCCL communicator was aborted (after a failure, or by abort()), and \
                     NCCL shrinks only a live one; destroy the group and create a new one",
                )
            });
            live.and_then(|raw| {
                // SAFETY: `raw` is live under its lock; `list`, `slot` and `cfg` are valid for
                // the call (NCCL copies the list and the config before returning).
                let r = unsafe {
                    shrink(
                        raw,
                        list.as_mut_ptr(),
                        list.len() as c_int,
                        slot,
                        &mut cfg,
                        flags,
                    )
                };
                if r == NcclResult::IN_PROGRESS {
                    return Ok(());
                }
                // SAFETY: as above.
                Ok(unsafe { self.nccl.check_comm(r, "ncclCommShrink", raw) }?)
            })
        };
        let settled = started
            .and_then(|()| self.settle("ncclCommShrink", Instant::now() + self.timeout.get()));
        // On an error NCCL may still write into `slot`: it stays allocated.
        settled?;
        // SAFETY: allocated above; NCCL is done with it once the parent has settled.
        let child = *unsafe { Box::from_raw(slot) };
        if child.is_null() {
            return Err(Error::backend("ncclCommShrink returned no communicator"));
        }
        let comm = Comm {
            nccl: self.nccl,
            raw: Mutex::new(child),
            timeout: Timeout::new(self.timeout.get()),
            shrunk: AtomicBool::new(false),
        };
        comm.settle("ncclCommShrink", Instant::now() + self.timeout.get())?;
        Ok(comm)
    }

    /// Runs `body` (the NCCL calls of one operation, given the communicator and the operator
    /// that `op` names) between ncclGroupStart and ncclGroupEnd, then waits until NCCL has
    /// enqueued it (non-blocking communicators may still be connecting).
    pub(crate) fn launch(
        &self,
        what: &'static str,
        dtype: rustdist_nccl_sys::NcclDataType,
        op: OpSpec,
        body: impl FnOnce(&'static Nccl, NcclComm, NcclRedOp) -> Result<()>,
    ) -> Result<()> {
        let nccl = self.nccl;
        let end = {
            let guard = self.lock();
            let raw = Self::live(&guard)?;
            let (red_op, created) = match op {
                OpSpec::Builtin(o) => (o, false),
                OpSpec::PreMulSum(factor) => {
                    let mut scalar = codes::premul_scalar(dtype, factor);
                    let mut o = NcclRedOp::SUM;
                    // SAFETY: `raw` is live; the scalar has `dtype`'s layout and is read before
                    // the call returns (HOST_IMMEDIATE).
                    let r = unsafe {
                        (nccl.red_op_create_pre_mul_sum)(
                            &mut o,
                            scalar.as_mut_ptr() as *mut c_void,
                            dtype,
                            NcclScalarResidence::HOST_IMMEDIATE,
                            raw,
                        )
                    };
                    // SAFETY: as above.
                    unsafe { nccl.check_comm(r, "ncclRedOpCreatePreMulSum", raw) }?;
                    (o, true)
                }
            };
            // SAFETY: plain call; opens a group on this thread, closed below on every path.
            let started = unsafe { (nccl.group_start)() };
            let outcome = nccl.check(started, "ncclGroupStart").map_err(Error::from);
            let outcome = outcome.and_then(|()| body(nccl, raw, red_op));
            // SAFETY: closes the group opened above (also after a failed call inside it).
            let ended = unsafe { (nccl.group_end)() };
            if created {
                // SAFETY: the operator belongs to `raw`, and its last use (ncclGroupEnd) has
                // returned.
                let _ = unsafe { (nccl.red_op_destroy)(red_op, raw) };
            }
            outcome?;
            if ended != NcclResult::IN_PROGRESS {
                // SAFETY: `raw` is live under its lock.
                unsafe { nccl.check_comm(ended, what, raw) }?;
            }
            ended
        };
        if end == NcclResult::IN_PROGRESS {
            self.settle(what, Instant::now() + self.timeout.get())?;
        }
        Ok(())
    }

    /// Aborts: NCCL's kernels stop and its resources are freed; later use fails. Idempotent.
    pub(crate) fn abort(&self) {
        let mut guard = self.lock();
        if !guard.is_null() {
            // SAFETY: the handle is live and becomes NULL under the lock, so no call uses it
            // after this.
            let _ = unsafe { (self.nccl.comm_abort)(*guard) };
            *guard = std::ptr::null_mut();
        }
    }

    /// Leaves cleanly: ncclCommFinalize (flushes issued work, polled until done or the
    /// timeout, then aborted instead) and ncclCommDestroy; a shrunk communicator is aborted.
    pub(crate) fn finalize(&self) {
        if self.shrunk.load(Ordering::Acquire) {
            self.abort();
            return;
        }
        if let Some(finalize) = self.nccl.comm_finalize {
            let r = {
                let guard = self.lock();
                let Ok(raw) = Self::live(&guard) else { return };
                // SAFETY: `raw` is live under its lock.
                unsafe { finalize(raw) }
            };
            let settled = match r {
                NcclResult::SUCCESS => Ok(()),
                NcclResult::IN_PROGRESS => {
                    self.settle("ncclCommFinalize", Instant::now() + self.timeout.get())
                }
                _ => Err(Error::backend("ncclCommFinalize failed")),
            };
            if settled.is_err() {
                self.abort();
                return;
            }
        }
        let mut guard = self.lock();
        if !guard.is_null() {
            // SAFETY: the handle is live and becomes NULL under the lock.
            let _ = unsafe { (self.nccl.comm_destroy)(*guard) };
            *guard = std::ptr::null_mut();
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // A communicator nobody finalized (a failed construction) must not leak its threads.
        self.abort();
    }
}
