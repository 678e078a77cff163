//! Owned CUDA runtime objects (device guard, stream, event, pinned and device memory), each
//! freed on drop, and the bounded wait on an event.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustdist_nccl_sys::{
    CudaError, CudaEvent, CudaMemcpyKind, CudaStream, Cudart, CUDA_EVENT_DISABLE_TIMING,
    CUDA_HOST_ALLOC_PORTABLE, CUDA_STREAM_NON_BLOCKING,
};

use crate::error::{Error, Result};

/// Makes `device` current on this thread and restores the previous one on drop (the caller's
/// thread belongs to torch, which keeps its own current device).
pub(crate) struct DeviceGuard {
    rt: &'static Cudart,
    prev: c_int,
    device: c_int,
}

impl DeviceGuard {
    pub(crate) fn set(rt: &'static Cudart, device: c_int) -> Result<DeviceGuard> {
        let mut prev: c_int = 0;
        // SAFETY: `prev` is a valid out-pointer.
        rt.check(unsafe { (rt.get_device)(&mut prev) }, "cudaGetDevice")?;
        if prev != device {
            // SAFETY: plain call; an invalid ordinal is reported as an error.
            rt.check(unsafe { (rt.set_device)(device) }, "cudaSetDevice")?;
        }
        Ok(DeviceGuard { rt, prev, device })
    }
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        if self.prev != self.device {
            // SAFETY: `prev` was current on this thread a moment ago, so it is valid.
            let _ = unsafe { (self.rt.set_device)(self.prev) };
        }
    }
}

/// A non-blocking stream (the group's internal stream).
pub(crate) struct Stream {
    rt: &'static Cudart,
    pub(crate) raw: CudaStream,
}

// SAFETY: a stream handle may be used from any thread of the process.
unsafe impl Send for Stream {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream on the current device.
    pub(crate) fn new(rt: &'static Cudart) -> Result<Stream> {
        let mut raw: CudaStream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        let r = unsafe { (rt.stream_create_with_flags)(&mut raw, CUDA_STREAM_NON_BLOCKING) };
        rt.check(r, "cudaStreamCreateWithFlags")?;
        Ok(Stream { rt, raw })
    }

    /// Makes this stream wait (on the device) for `event`'s last record.
    pub(crate) fn wait(&self, event: &Event) -> Result<()> {
        stream_wait(self.rt, self.raw, event)
    }

    /// Enqueues a copy of `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges are valid for `kind` until the copy has run on the stream.
    pub(crate) unsafe fn copy(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        kind: CudaMemcpyKind,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the caller keeps both ranges valid until the copy has run.
        let r = unsafe {
            (self.rt.memcpy_async)(
                dst as *mut c_void,
                src as *const c_void,
                len,
                kind,
                self.raw,
            )
        };
        Ok(self.rt.check(r, "cudaMemcpyAsync")?)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by cudaStreamCreateWithFlags and destroyed once; work still queued
        // on it completes first (CUDA defers the release).
        let _ = unsafe { (self.rt.stream_destroy)(self.raw) };
    }
}

/// Makes `stream` (any stream, e.g. the caller's) wait for `event`'s last record.
pub(crate) fn stream_wait(rt: &'static Cudart, stream: CudaStream, event: &Event) -> Result<()> {
    // SAFETY: both handles are live; flags 0 is cudaEventWaitDefault.
    let r = unsafe { (rt.stream_wait_event)(stream, event.raw, 0) };
    Ok(rt.check(r, "cudaStreamWaitEvent")?)
}

/// An event without timing, for ordering and completion.
pub(crate) struct Event {
    rt: &'static Cudart,
    raw: CudaEvent,
}

// SAFETY: an event handle may be recorded, queried and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for Event {}

impl Event {
    /// An event recorded on `stream` now (it completes when the stream's work so far has).
    pub(crate) fn record(rt: &'static Cudart, stream: CudaStream) -> Result<Event> {
        let mut raw: CudaEvent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        let r = unsafe { (rt.event_create_with_flags)(&mut raw, CUDA_EVENT_DISABLE_TIMING) };
        rt.check(r, "cudaEventCreateWithFlags")?;
        let event = Event { rt, raw };
        // SAFETY: both handles are live.
        let r = unsafe { (rt.event_record)(event.raw, stream) };
        rt.check(r, "cudaEventRecord")?;
        Ok(event)
    }

    /// Whether the recorded work has completed; an error is a failure on the device.
    pub(crate) fn done(&self) -> Result<bool> {
        // SAFETY: the handle is live.
        match unsafe { (self.rt.event_query)(self.raw) } {
            CudaError::NOT_READY => Ok(false),
            r => self
                .rt
                .check(r, "cudaEventQuery")
                .map(|()| true)
                .map_err(Into::into),
        }
    }

    /// Polls until done, `deadline` passes (a timeout naming `what`) or `cancelled` returns an
    /// error; never blocks in CUDA, so an aborted group cannot leave a thread stuck here.
    pub(crate) fn wait(
        &self,
        deadline: Instant,
        what: &str,
        cancelled: impl Fn() -> Option<Error>,
    ) -> Result<()> {
        let mut pause = Duration::from_micros(10);
        loop {
            if self.done()? {
                return Ok(());
            }
            if let Some(e) = cancelled() {
                return Err(e);
            }
            if Instant::now() >= deadline {
                return Err(Error::backend(format!("{what} timed out")));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created above and destroyed once; CUDA releases a pending event only once
        // its work completes.
        let _ = unsafe { (self.rt.event_destroy)(self.raw) };
    }
}

/// `len` bytes of page-locked host memory (the staging buffer of host-path operations).
pub(crate) struct Pinned {
    rt: &'static Cudart,
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: plain memory owned by this value.
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(rt: &'static Cudart, len: usize) -> Result<Pinned> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; len > 0 (the pool rounds up).
        let r = unsafe { (rt.host_alloc)(&mut ptr, len, CUDA_HOST_ALLOC_PORTABLE) };
        rt.check(r, "cudaHostAlloc")?;
        Ok(Pinned { rt, ptr, len })
    }

    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cudaHostAlloc and freed once.
        let _ = unsafe { (self.rt.free_host)(self.ptr) };
    }
}

/// Reuses pinned buffers: cudaHostAlloc costs milliseconds, far more than a small collective.
pub(crate) struct PinnedPool {
    rt: &'static Cudart,
    free: Mutex<Vec<Pinned>>,
}

/// Buffers kept for reuse; beyond this, returned ones are freed.
const POOL_KEEP: usize = 8;

impl PinnedPool {
    pub(crate) fn new(rt: &'static Cudart) -> Arc<PinnedPool> {
        Arc::new(PinnedPool {
            rt,
            free: Mutex::new(Vec::new()),
        })
    }

    /// A buffer of at least `len` bytes, back in the pool when the lease drops.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> Result<Lease> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len >= len)
            .min_by_key(|(_, b)| b.len)
            .map(|(i, _)| i);
        let buf = match best {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                Pinned::new(self.rt, len.max(1 << 16).next_power_of_two())?
            }
        };
        Ok(Lease {
            buf: Some(buf),
            pool: self.clone(),
        })
    }
}

/// A pinned buffer on loan from a [`PinnedPool`].
pub(crate) struct Lease {
    buf: Option<Pinned>,
    pool: Arc<PinnedPool>,
}

impl Lease {
    pub(crate) fn addr(&self) -> usize {
        self.buf.as_ref().map_or(0, Pinned::addr)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < POOL_KEEP {
                free.push(buf);
            }
        }
    }
}

/// A small device allocation (the barrier's one-element all_reduce).
pub(crate) struct DeviceMem {
    rt: &'static Cudart,
    pub(crate) ptr: usize,
}

impl DeviceMem {
    /// `len` bytes on the current device.
    pub(crate) fn new(rt: &'static Cudart, len: usize) -> Result<DeviceMem> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        rt.check(unsafe { (rt.malloc)(&mut ptr, len) }, "cudaMalloc")?;
        Ok(DeviceMem {
            rt,
            ptr: ptr as usize,
        })
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: allocated by cudaMalloc and freed once.
        let _ = unsafe { (self.rt.free)(self.ptr as *mut c_void) };
    }
}
