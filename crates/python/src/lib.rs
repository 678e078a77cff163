//! `rustdist._core`: thin PyO3 wrappers over rustdist-core. Converts arguments, releases the
//! GIL around every blocking call, and maps core errors to Python exceptions (see `error.rs`).

use pyo3::prelude::*;

mod cuda;
mod dlpack;
mod error;
mod fast;
mod flight;
mod group;
mod interrupt;
mod store;
mod work;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    interrupt::install();
    store::register(m)?;
    cuda::register(m)?;
    flight::register(m)?;
    m.add_class::<group::PyProcessGroup>()?;
    m.add_function(wrap_pyfunction!(group::selection_table, m)?)?;
    m.add_class::<work::PyWork>()?;
    m.add_function(wrap_pyfunction!(work::join, m)?)?;
    m.add_function(wrap_pyfunction!(fast::fast_function, m)?)?;
    m.add_function(wrap_pyfunction!(fast::fast_init, m)?)?;
    m.add_function(wrap_pyfunction!(fast::cuda_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(tls_test_pki, m)?)?;
    Ok(())
}

/// Writes a test PKI into `dir`: `ca.pem`, `NAME.pem`/`NAME.key` for each of `names`, and
/// `rogue.pem`/`rogue.key` from another CA (`rogue-ca.pem`), for the TLS tests.
#[pyfunction]
fn tls_test_pki(py: Python<'_>, dir: &str, names: Vec<String>) -> PyResult<()> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    py.detach(|| rustdist_core::tls::write_test_pki(std::path::Path::new(dir), &names))
        .map_err(|e| error::PyDistError(e).into())
}
