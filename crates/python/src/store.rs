//! Store pyclasses (TCPStore, FileStore, HashStore, PrefixStore) and the adapter that lets a
//! Python store object (e.g. torch's) serve the core.

use std::sync::Arc;

use pyo3::prelude::*;
use rustdist_core::store::Store;

/// The core store behind `obj`: a rustdist store's own, or an adapter calling `obj`'s methods.
pub fn store_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Arc<dyn Store>> {
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "not a store: {}",
        obj.get_type().name()?
    )))
}

pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
