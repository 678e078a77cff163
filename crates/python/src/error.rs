//! The one place where core errors become Python exceptions.
//!
//! The `Dist*Error` classes are defined in `rustdist/_errors.py` (they subclass torch's classes
//! of the same names when torch is importable), so they are looked up there once.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use rustdist_core::Error;

use crate::interrupt;

/// Core error carried to Python; `?` converts it at the binding boundary.
pub struct PyDistError(pub Error);

impl From<Error> for PyDistError {
    fn from(e: Error) -> Self {
        PyDistError(e)
    }
}

fn dist_class(
    py: Python<'_>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<Py<PyType>> {
    cell.get_or_try_init(py, || {
        let cls = py.import("rustdist._errors")?.getattr(name)?;
        Ok(cls.cast_into::<PyType>()?.unbind())
    })
    .map(|c| c.clone_ref(py))
}

static DIST_STORE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DIST_NETWORK_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DIST_BACKEND_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

impl From<PyDistError> for PyErr {
    fn from(err: PyDistError) -> PyErr {
        let msg = err.0.to_string();
        let (cell, name) = match err.0 {
            Error::InvalidArgument(_) => return PyValueError::new_err(msg),
            Error::Type(_) => return PyTypeError::new_err(msg),
            Error::Runtime(_) => return PyRuntimeError::new_err(msg),
            Error::Store(_) => (&DIST_STORE_ERROR, "DistStoreError"),
            Error::Network(_) => (&DIST_NETWORK_ERROR, "DistNetworkError"),
            Error::Backend(_) => (&DIST_BACKEND_ERROR, "DistBackendError"),
            Error::Interrupted => return interrupt::take_pending(),
        };
        Python::attach(|py| match dist_class(py, cell, name) {
            Ok(cls) => PyErr::from_type(cls.into_bound(py), msg),
            Err(import_err) => import_err,
        })
    }
}

/// Result type of binding functions that call into the core.
pub type CoreResult<T> = Result<T, PyDistError>;
