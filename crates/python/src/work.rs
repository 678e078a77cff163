//! `_core.Work`: the Python handle of an engine Work.

use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use rustdist_core::work::{Finish, Keepalive};
use rustdist_core::Work;

use crate::error::PyDistError;
use crate::interrupt;

#[pyclass(module = "rustdist._core", name = "Work", frozen)]
pub struct PyWork {
    work: Work,
}

impl From<Work> for PyWork {
    fn from(work: Work) -> Self {
        PyWork { work }
    }
}

/// `_core.join(works, copies, keep)`: one Work for several, done once all are; on success it
/// first copies each `(source pointer, destination pointer, bytes)` of `copies`, in order (the
/// staged outputs of a call whose tensors share memory back into place). `keep` holds those
/// buffers until then.
#[pyfunction]
#[pyo3(signature = (works, copies = Vec::new(), keep = None))]
pub fn join(
    works: Vec<PyRef<'_, PyWork>>,
    copies: Vec<(usize, usize, usize)>,
    keep: Option<Py<PyAny>>,
) -> PyWork {
    let works: Vec<Work> = works.iter().map(|w| w.work.clone()).collect();
    let finish: Finish = Box::new(move || {
        for (src, dst, len) in copies {
            // SAFETY: the Python layer passes pointers of live contiguous buffers of `len`
            // bytes each, which `keep` holds until the joined Work completes; the parts have
            // completed, so nothing else touches them now. ptr::copy allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        }
        Ok(())
    });
    let keep = keep.map(|k| -> Keepalive { Box::new(k) });
    Work::join(&works, finish, keep).into()
}

fn error_object(py: Python<'_>, e: &rustdist_core::Error) -> Py<PyAny> {
    PyErr::from(PyDistError(e.clone()))
        .into_value(py)
        .into_any()
}

#[pymethods]
impl PyWork {
    /// Blocks (GIL released) until done; raises the op's error, or DistBackendError when
    /// `timeout` seconds pass first (the Work keeps running).
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let work = self.work.clone();
        let timeout = timeout.map(Duration::from_secs_f64);
        interrupt::blocking(py, || work.wait(timeout)).map_err(PyDistError)?;
        Ok(true)
    }

    fn is_completed(&self) -> bool {
        self.work.is_completed()
    }

    fn is_success(&self) -> bool {
        matches!(self.work.outcome(), Some(Ok(())))
    }

    fn exception(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        match self.work.outcome() {
            Some(Err(e)) => Some(error_object(py, &e)),
            _ => None,
        }
    }

    fn source_rank(&self) -> PyResult<usize> {
        self.work.source_rank().ok_or_else(|| {
            PyRuntimeError::new_err("source_rank() is only available for a completed receive")
        })
    }

    /// Calls `fn(None)` or `fn(error)` once the Work completes, on the engine's thread.
    fn add_done_callback(&self, callback: Py<PyAny>) {
        self.work.on_complete(Box::new(move |outcome| {
            Python::attach(|py| {
                let arg = match outcome {
                    Ok(()) => py.None(),
                    Err(e) => error_object(py, e),
                };
                if let Err(err) = callback.call1(py, (arg,)) {
                    err.write_unraisable(py, Some(callback.bind(py)));
                }
            })
        }));
    }
}
