//! `_core.Window`: a one-sided window registered on a group's ranks (UNIFIED access on one
//! host with shared memory, SEPARATE elsewhere).
//! Tensors arrive as (pointer, element count, dtype code) plus a `keep` object held until the
//! Work completes, as in `group.rs`.

use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rustdist_core::group::{Run, Window};
use rustdist_core::ProcessGroup;

use crate::error::CoreResult;
use crate::flight;
use crate::group::{bufferless, how, started, tensor, timeout_from_secs, PyProcessGroup};
use crate::interrupt;
use crate::work::PyWork;

#[pyclass(module = "rustdist._core", name = "Window", frozen)]
pub struct PyWindow {
    pg: Arc<ProcessGroup>,
    window: Window,
    /// Every rank's registration as `put_now` checks it: (element count, dtype code, bytes
    /// per element), set once by the Python layer.
    targets: OnceLock<Vec<(usize, u8, usize)>>,
}

#[pymethods]
impl PyWindow {
    /// Registers `nbytes` bytes of window memory on every rank of `group` (collective),
    /// holding the `nbytes` bytes at `ptr` (the caller keeps them alive for the call); returns
    /// the window and each rank's `meta` bytes.
    #[staticmethod]
    fn register(
        py: Python<'_>,
        group: &PyProcessGroup,
        ptr: usize,
        nbytes: usize,
        meta: Vec<u8>,
    ) -> CoreResult<(PyWindow, Vec<Py<PyBytes>>)> {
        let pg = group.core();
        let core = pg.clone();
        let initial: &[u8] = if nbytes == 0 {
            &[]
        } else {
            // SAFETY: the Python layer passes the data pointer of a live contiguous tensor of
            // `nbytes` bytes, which it holds until this call returns.
            unsafe { std::slice::from_raw_parts(ptr as *const u8, nbytes) }
        };
        let (window, metas) =
            interrupt::blocking(py, move || core.register_window(initial, &meta))?;
        let metas = metas.iter().map(|m| PyBytes::new(py, m).unbind()).collect();
        let targets = OnceLock::new();
        Ok((
            PyWindow {
                pg,
                window,
                targets,
            },
            metas,
        ))
    }

    /// The address where rank `rank`'s registered bytes are mapped in this process; an error
    /// for a peer's with SEPARATE access (not mapped here).
    fn address(&self, rank: usize) -> PyResult<usize> {
        match self.window.memory(rank) {
            Some(memory) => Ok(memory.data() as usize),
            None => Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "rank {rank}'s window is reached over the network (access type SEPARATE): \
                 map_remote_tensor aliases only memory of ranks on this host with shared \
                 memory (UNIFIED); put into it and signal instead"
            ))),
        }
    }

    /// How many bytes rank `rank` registered.
    fn nbytes(&self, rank: usize) -> usize {
        self.window.bytes(rank)
    }

    /// Whether peers' memories are mapped here (access type UNIFIED) rather than reached by
    /// frames on the links (SEPARATE).
    #[getter]
    fn unified(&self) -> bool {
        self.window.unified()
    }

    /// Sets every rank's (element count, dtype code, bytes per element), which `put_now`
    /// checks puts against; once.
    fn set_targets(&self, targets: Vec<(usize, u8, usize)>) {
        let _ = self.targets.set(targets);
    }

    /// A synchronous put of `obj` (a plain contiguous CPU torch tensor or a C-contiguous
    /// buffer such as a numpy array) into rank `dst`'s window at element `offset`, without the
    /// Python layer: False, having done nothing, when the call is not that simple or its
    /// checks fail (the Python layer then runs it, or raises the error).
    fn put_now(
        &self,
        py: Python<'_>,
        obj: &Bound<'_, PyAny>,
        dst: isize,
        offset: isize,
    ) -> CoreResult<bool> {
        let (Some(targets), Ok(dst), Ok(offset)) = (
            self.targets.get(),
            usize::try_from(dst),
            usize::try_from(offset),
        ) else {
            return Ok(false);
        };
        let Some(&(target_numel, target_code, itemsize)) = targets.get(dst) else {
            return Ok(false);
        };
        let Some((ptr, numel, code)) =
            crate::fast::cpu_dense(obj).or_else(|| crate::buffer::contiguous(obj))
        else {
            return Ok(false);
        };
        if code != target_code
            || offset
                .checked_add(numel)
                .is_none_or(|end| end > target_numel)
        {
            return Ok(false);
        }
        // `obj` (read above) stays alive for this synchronous call.
        let src = tensor(ptr, numel, code)?;
        let (pg, window) = (&self.pg, &self.window);
        interrupt::blocking(py, move || {
            pg.window_put(window, src, dst, offset * itemsize, Run::Sync)
        })?;
        Ok(true)
    }

    /// Ends the registration on every rank (collective).
    fn deregister(&self, py: Python<'_>) -> CoreResult<()> {
        let (pg, window) = (&self.pg, &self.window);
        Ok(interrupt::blocking(py, move || {
            pg.deregister_window(window)
        })?)
    }

    #[pyo3(signature = (ptr, numel, dtype, dst, offset_bytes, keep, sync = false))]
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        dst: usize,
        offset_bytes: usize,
        keep: Py<PyAny>,
        sync: bool,
    ) -> CoreResult<Option<PyWork>> {
        let src = tensor(ptr, numel, dtype)?;
        let (pg, window, run) = (&self.pg, &self.window, how(keep, sync));
        flight::note_stack(py);
        started(interrupt::blocking(py, move || {
            pg.window_put(window, src, dst, offset_bytes, run)
        })?)
    }

    #[pyo3(signature = (dst, sync = false))]
    fn signal(&self, py: Python<'_>, dst: usize, sync: bool) -> CoreResult<Option<PyWork>> {
        let (pg, window, run) = (&self.pg, &self.window, bufferless(sync));
        flight::note_stack(py);
        started(interrupt::blocking(py, move || {
            pg.window_signal(window, dst, run)
        })?)
    }

    /// Waits for rank `src`'s next signal, within `timeout` seconds (None: the group's).
    #[pyo3(signature = (src, timeout = None, sync = false))]
    fn wait_signal(
        &self,
        py: Python<'_>,
        src: usize,
        timeout: Option<f64>,
        sync: bool,
    ) -> PyResult<Option<PyWork>> {
        let timeout = timeout.map(timeout_from_secs).transpose()?;
        let (pg, window, run) = (&self.pg, &self.window, bufferless(sync));
        flight::note_stack(py);
        let work =
            interrupt::blocking(py, move || pg.window_wait_signal(window, src, timeout, run));
        Ok(started(work.map_err(crate::error::PyDistError::from)?)?)
    }
}
