//! What the fast path needs from the Python side (torch's tensor type and dtypes, the ReduceOp
//! SUM, rustdist's API and debug namespaces), set once by `fast_init`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use crate::dlpack::DlpackReader;

/// What the fast path needs from the Python side, set once by `fast_init`.
pub(super) struct State {
    /// `torch.Tensor`: only tensors of exactly this type qualify (subclasses go to Python).
    pub(super) tensor: Py<PyType>,
    /// (dtype, `_core` dtype code) for the dtypes rustdist supports: dtypes are singletons,
    /// so a scan by identity costs less than hashing into a dict.
    pub(super) dtype_codes: Vec<(Py<PyAny>, u8)>,
    /// torch's DLPack exchange API, where torch has it (else tensors are read attribute by
    /// attribute).
    pub(super) dlpack: Option<DlpackReader>,
    /// `ReduceOp.SUM`, and the ReduceOp class whose instances carry it in `.op`.
    pub(super) sum: Py<PyAny>,
    pub(super) op_class: Py<PyType>,
    /// The namespace of rustdist's `distributed_c10d` (its `_default_pg`) and its
    /// ProcessGroup class. Namespaces, not modules: a dict lookup costs less than a
    /// module's attribute lookup, on every call.
    pub(super) api: Py<PyDict>,
    pub(super) group_class: Py<PyType>,
    /// The namespace of rustdist's `_debug` (its `detail` flag) and its failure logger
    /// `log(name, e)`.
    pub(super) debug: Py<PyDict>,
    pub(super) log: Py<PyAny>,
    /// The namespace of `torch.autograd.profiler` (its `_is_profiler_enabled` flag: while a
    /// profiler records, calls go to Python, which records them).
    pub(super) profiler: Py<PyDict>,
    /// What an asynchronous call returns, made from the engine's Work and the call's output
    /// tensors: rustdist's `Work` class (import swap), and the torch front door's maker of a
    /// Work handed to torch.
    pub(super) work: Py<PyAny>,
    pub(super) handed_work: Py<PyAny>,
}

pub(super) static STATE: PyOnceLock<State> = PyOnceLock::new();

/// Sets up the fast path (once; later calls are ignored).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn fast_init(
    py: Python<'_>,
    tensor: Py<PyType>,
    dtype_codes: Py<PyDict>,
    sum: Py<PyAny>,
    op_class: Py<PyType>,
    api: Py<PyModule>,
    group_class: Py<PyType>,
    debug: Py<PyModule>,
    log: Py<PyAny>,
    profiler: Py<PyModule>,
    work: Py<PyAny>,
    handed_work: Py<PyAny>,
) -> PyResult<()> {
    let dtype_codes = dtype_codes
        .bind(py)
        .iter()
        .map(|(dtype, code)| Ok((dtype.unbind(), code.extract()?)))
        .collect::<PyResult<Vec<_>>>()?;
    let dlpack = DlpackReader::new(tensor.bind(py), &dtype_codes);
    let _ = STATE.set(
        py,
        State {
            tensor,
            dtype_codes,
            dlpack,
            sum,
            op_class,
            api: api.bind(py).dict().unbind(),
            group_class,
            debug: debug.bind(py).dict().unbind(),
            log,
            profiler: profiler.bind(py).dict().unbind(),
            work,
            handed_work,
        },
    );
    Ok(())
}
