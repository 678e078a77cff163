//! `rustdist._core`: thin PyO3 wrappers over rustdist-core. Converts arguments, releases the
//! GIL around every blocking call, and maps core errors to Python exceptions (see `error.rs`).

use pyo3::prelude::*;

mod buffer;
mod cuda;
mod dlpack;
mod error;
mod fast;
mod flight;
mod group;
mod interrupt;
mod store;
mod window;
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
    m.add_class::<window::PyWindow>()?;
    m.add_function(wrap_pyfunction!(work::join, m)?)?;
    m.add_function(wrap_pyfunction!(fast::fast_function, m)?)?;
    m.add_function(wrap_pyfunction!(fast::fast_init, m)?)?;
    m.add_function(wrap_pyfunction!(fast::cuda_buffer, m)?)?;
    Ok(())
}
