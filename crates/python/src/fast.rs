//! `_core.FastPath`: the usual synchronous call of a hot collective (a plain contiguous CPU
//! tensor, the default op, a rustdist group, no DETAIL checks) goes from Python straight to
//! the engine; any other call, and every error of the checks, goes to the Python function it
//! stands in for, which handles the rest of torch.distributed's semantics. The Python layer
//! costs about as much as the collective itself on small messages, which is why this exists.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyString, PyTuple, PyType};

use crate::dlpack::DlpackReader;
use crate::group::{ExchangeBlocks, GatherOutputs, PyProcessGroup};

/// What the fast path needs from the Python side, set once by `fast_init`.
struct State {
    /// `torch.Tensor`: only tensors of exactly this type qualify (subclasses go to Python).
    tensor: Py<PyType>,
    /// (dtype, `_core` dtype code) for the dtypes rustdist supports: dtypes are singletons,
    /// so a scan by identity costs less than hashing into a dict.
    dtype_codes: Vec<(Py<PyAny>, u8)>,
    /// torch's DLPack exchange API, where torch has it (else tensors are read attribute by
    /// attribute).
    dlpack: Option<DlpackReader>,
    /// `ReduceOp.SUM`, and the ReduceOp class whose instances carry it in `.op`.
    sum: Py<PyAny>,
    op_class: Py<PyType>,
    /// The namespace of rustdist's `distributed_c10d` (its `_default_pg`) and its
    /// ProcessGroup class. Namespaces, not modules: a dict lookup costs less than a
    /// module's attribute lookup, on every call.
    api: Py<PyDict>,
    group_class: Py<PyType>,
    /// The namespace of rustdist's `_debug` (its `detail` flag) and its failure logger
    /// `log(name, e)`.
    debug: Py<PyDict>,
    log: Py<PyAny>,
}

static STATE: PyOnceLock<State> = PyOnceLock::new();

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
        },
    );
    Ok(())
}

#[derive(Clone, Copy)]
enum Op {
    AllReduce,
    Broadcast,
    AllGatherIntoTensor,
    ReduceScatterTensor,
    AllToAllSingle,
    Barrier,
}

impl Op {
    /// The Python function's parameters, in order.
    fn params(self) -> &'static [&'static str] {
        match self {
            Op::AllReduce => &["tensor", "op", "group", "async_op"],
            Op::Broadcast => &["tensor", "src", "group", "async_op", "group_src"],
            Op::AllGatherIntoTensor => &["output_tensor", "input_tensor", "group", "async_op"],
            Op::ReduceScatterTensor => &["output", "input", "op", "group", "async_op"],
            Op::AllToAllSingle => &[
                "output",
                "input",
                "output_split_sizes",
                "input_split_sizes",
                "group",
                "async_op",
            ],
            Op::Barrier => &["group", "async_op", "device_ids", "timeout"],
        }
    }
}

/// A hot collective's fast path in front of its Python function (see the module doc).
#[pyclass(module = "rustdist._core", frozen)]
pub struct FastPath {
    op: Op,
    python: Py<PyAny>,
}

/// The most parameters a fast-path function has.
const MAX_PARAMS: usize = 6;

/// The call's arguments by parameter position; None when they do not bind plainly (too
/// many, unknown or repeated keywords: Python raises the right error).
fn bind<'py>(
    params: &[&str],
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> Option<[Option<Bound<'py, PyAny>>; MAX_PARAMS]> {
    if args.len() > params.len() {
        return None;
    }
    let mut bound: [Option<Bound<'py, PyAny>>; MAX_PARAMS] = Default::default();
    for (slot, arg) in bound.iter_mut().zip(args.iter()) {
        *slot = Some(arg);
    }
    for (key, value) in kwargs.into_iter().flatten() {
        let key = key.cast::<PyString>().ok()?.to_cow().ok()?;
        let i = params.iter().position(|p| *p == key)?;
        if bound[i].replace(value).is_some() {
            return None;
        }
    }
    Some(bound)
}

/// The argument, None when absent or None.
fn given<'a, 'py>(arg: &'a Option<Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    arg.as_ref().filter(|a| !a.is_none())
}

/// Whether `async_op` is absent or False.
fn synchronous(arg: &Option<Bound<'_, PyAny>>) -> bool {
    arg.as_ref()
        .is_none_or(|a| a.is(PyBool::new(a.py(), false).as_any()))
}

/// (data pointer, numel, dtype code) of a plain contiguous CPU tensor of a supported dtype.
fn cpu_tensor(st: &State, x: &Bound<'_, PyAny>) -> PyResult<Option<(usize, usize, u8)>> {
    let py = x.py();
    if !x.get_type().is(st.tensor.bind(py)) {
        return Ok(None);
    }
    if let Some(reader) = &st.dlpack {
        return Ok(reader.cpu_buffer(x));
    }
    let dtype = x.getattr(intern!(py, "dtype"))?;
    let Some(&(_, code)) = st.dtype_codes.iter().find(|(d, _)| dtype.is(d)) else {
        return Ok(None);
    };
    let yes = PyBool::new(py, true);
    if !x.getattr(intern!(py, "is_cpu"))?.is(yes.as_any())
        || !x
            .call_method0(intern!(py, "is_contiguous"))?
            .is(yes.as_any())
    {
        return Ok(None);
    }
    let ptr = address(&x.call_method0(intern!(py, "data_ptr"))?)?;
    let numel = x.call_method0(intern!(py, "numel"))?.extract()?;
    Ok(Some((ptr, numel, code)))
}

/// The int `x` as an address. `extract::<usize>` converts through `PyLong_AsUnsignedLongLong`,
/// which on CPython before 3.12 takes a byte-array detour for any int over 30 bits (every
/// address); `PyLong_AsUnsignedLong` (64 bits here) reads the digits directly.
fn address(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    // SAFETY: `x` is a live object for the duration of the call; on a non-int or negative
    // value the function sets a Python error and returns c_ulong::MAX, checked below.
    let v = unsafe { pyo3::ffi::PyLong_AsUnsignedLong(x.as_ptr()) };
    if v == std::ffi::c_ulong::MAX {
        if let Some(e) = PyErr::take(x.py()) {
            return Err(e);
        }
    }
    usize::try_from(v).map_err(|_| PyValueError::new_err("address out of range"))
}

/// Whether `x` (`numel` elements) has a dimension 0 that splits into `size` equal blocks
/// (else torch's error comes from Python). A 1-D tensor's rows are its elements, which saves
/// building its shape.
fn rows_divide(x: &Bound<'_, PyAny>, numel: usize, size: usize) -> PyResult<bool> {
    let py = x.py();
    let rows = match x.call_method0(intern!(py, "dim"))?.extract::<usize>()? {
        0 => return Ok(false),
        1 => numel,
        _ => x
            .getattr(intern!(py, "shape"))?
            .cast::<PyTuple>()?
            .get_item(0)?
            .extract()?,
    };
    Ok(rows % size == 0)
}

/// Whether `op` is absent or SUM (a `ReduceOp.SUM` value or a ReduceOp holding it, as
/// torch's option objects pass it to a backend).
fn is_sum(st: &State, op: &Option<Bound<'_, PyAny>>) -> PyResult<bool> {
    let Some(op) = op else {
        return Ok(true);
    };
    let py = op.py();
    let sum = st.sum.bind(py);
    if op.is(sum) {
        return Ok(true);
    }
    // A ReduceOp compares equal to the op type it holds (in C++: cheaper than reading `.op`,
    // which makes a new enum object on every read).
    Ok(op.get_type().is(st.op_class.bind(py)) && op.eq(sum)?)
}

/// The rustdist group `group` names (the default one for None) with its engine group.
fn rustdist_group<'py>(
    st: &State,
    py: Python<'py>,
    group: &Option<Bound<'py, PyAny>>,
) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyProcessGroup>)>> {
    let pg = match given(group) {
        Some(g) => g.clone(),
        None => match st.api.bind(py).get_item(intern!(py, "_default_pg"))? {
            Some(pg) => pg,
            None => return Ok(None),
        },
    };
    if !pg.get_type().is(st.group_class.bind(py)) {
        return Ok(None);
    }
    let core = pg
        .getattr(intern!(py, "_pg"))?
        .cast_into::<PyProcessGroup>()?;
    Ok(Some((pg, core)))
}

/// A call that takes the fast path, with what the engine needs.
enum Ready<'py> {
    AllReduce(Bound<'py, PyProcessGroup>, Buf),
    Broadcast(Bound<'py, PyProcessGroup>, Buf, usize),
    AllGather(Bound<'py, PyProcessGroup>, Buf, usize),
    ReduceScatter(Bound<'py, PyProcessGroup>, usize, Buf),
    /// (group, output, input): blocks of equal size.
    AllToAll(Bound<'py, PyProcessGroup>, Buf, Buf),
    Barrier(Bound<'py, PyProcessGroup>),
}

/// (data pointer, numel, dtype code).
type Buf = (usize, usize, u8);

impl FastPath {
    /// The call, when it is the usual kind; None hands it to Python (also when a check
    /// fails with an error: Python raises the error torch.distributed would).
    fn ready<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Option<Ready<'py>>> {
        let Some(st) = STATE.get(py) else {
            return Ok(None);
        };
        let Some(a) = bind(self.op.params(), args, kwargs) else {
            return Ok(None);
        };
        let detail = st.debug.bind(py).get_item(intern!(py, "detail"))?;
        if detail.is_none_or(|d| !d.is(PyBool::new(py, false).as_any())) {
            return Ok(None);
        }
        Ok(match self.op {
            Op::AllReduce => {
                let (Some(t), true, true) = (given(&a[0]), is_sum(st, &a[1])?, synchronous(&a[3]))
                else {
                    return Ok(None);
                };
                match (rustdist_group(st, py, &a[2])?, cpu_tensor(st, t)?) {
                    (Some((_, core)), Some(buf)) => Some(Ready::AllReduce(core, buf)),
                    _ => None,
                }
            }
            Op::Broadcast => {
                let (Some(t), true) = (given(&a[0]), synchronous(&a[3])) else {
                    return Ok(None);
                };
                let (Some((pg, core)), Some(buf)) =
                    (rustdist_group(st, py, &a[2])?, cpu_tensor(st, t)?)
                else {
                    return Ok(None);
                };
                let root = match (given(&a[1]), given(&a[4])) {
                    (None, Some(group_src)) => group_src.extract::<usize>()?,
                    (Some(src), None) => {
                        let ranks = pg.getattr(intern!(py, "_group_ranks"))?;
                        if ranks.is_none() {
                            src.extract::<usize>()?
                        } else {
                            match ranks.cast::<PyDict>()?.get_item(src)? {
                                Some(r) => r.extract()?,
                                None => return Ok(None),
                            }
                        }
                    }
                    _ => return Ok(None),
                };
                (root < core.get().size()).then_some(Ready::Broadcast(core, buf, root))
            }
            Op::AllGatherIntoTensor | Op::ReduceScatterTensor => {
                let gather = matches!(self.op, Op::AllGatherIntoTensor);
                let (op_ok, group, sync) = if gather {
                    (true, &a[2], synchronous(&a[3]))
                } else {
                    (is_sum(st, &a[2])?, &a[3], synchronous(&a[4]))
                };
                let (Some(out), Some(inp), true, true) = (given(&a[0]), given(&a[1]), op_ok, sync)
                else {
                    return Ok(None);
                };
                let (Some((_, core)), Some(o), Some(i)) = (
                    rustdist_group(st, py, group)?,
                    cpu_tensor(st, out)?,
                    cpu_tensor(st, inp)?,
                ) else {
                    return Ok(None);
                };
                let (big, small) = if gather { (o, i) } else { (i, o) };
                if big.2 != small.2 || big.1 != core.get().size() * small.1 {
                    return Ok(None);
                }
                Some(if gather {
                    Ready::AllGather(core, small, big.0)
                } else {
                    Ready::ReduceScatter(core, big.0, small)
                })
            }
            Op::AllToAllSingle => {
                let (Some(out), Some(inp), None, None, true) = (
                    given(&a[0]),
                    given(&a[1]),
                    given(&a[2]),
                    given(&a[3]),
                    synchronous(&a[5]),
                ) else {
                    return Ok(None);
                };
                let (Some((_, core)), Some(o), Some(i)) = (
                    rustdist_group(st, py, &a[4])?,
                    cpu_tensor(st, out)?,
                    cpu_tensor(st, inp)?,
                ) else {
                    return Ok(None);
                };
                let size = core.get().size();
                let equal = o.1 == i.1 && o.2 == i.2;
                (equal && rows_divide(out, o.1, size)? && rows_divide(inp, i.1, size)?)
                    .then_some(Ready::AllToAll(core, o, i))
            }
            Op::Barrier => {
                if !synchronous(&a[1]) || given(&a[2]).is_some() || given(&a[3]).is_some() {
                    return Ok(None);
                }
                rustdist_group(st, py, &a[0])?.map(|(_, core)| Ready::Barrier(core))
            }
        })
    }
}

/// Runs a call that took the fast path, synchronously, on the engine.
fn run(py: Python<'_>, call: Ready<'_>) -> PyResult<()> {
    let none = || py.None();
    match call {
        Ready::AllReduce(core, (ptr, n, code)) => {
            core.get()
                .all_reduce(py, ptr, n, code, 0, none(), None, true)?;
        }
        Ready::Broadcast(core, (ptr, n, code), root) => {
            core.get().broadcast(py, ptr, n, code, root, none(), true)?;
        }
        Ready::AllGather(core, (ptr, n, code), out) => {
            let outputs = GatherOutputs::Contiguous(out);
            core.get()
                .all_gather(py, ptr, outputs, n, code, none(), true)?;
        }
        Ready::ReduceScatter(core, input, (ptr, n, code)) => {
            core.get()
                .reduce_scatter(py, input, ptr, n, code, 0, none(), None, true)?;
        }
        Ready::AllToAll(core, (out, n, code), (inp, _, _)) => {
            let count = (n / core.get().size()) as u64;
            let (sends, recvs) = (ExchangeBlocks::Uniform(inp), ExchangeBlocks::Uniform(out));
            core.get()
                .exchange(py, "all_to_all", code, count, sends, recvs, none(), true)?;
        }
        Ready::Barrier(core) => {
            core.get().barrier(py, true)?;
        }
    }
    Ok(())
}

#[pymethods]
impl FastPath {
    /// The fast path of `name` (all_reduce, broadcast, all_gather_into_tensor,
    /// reduce_scatter_tensor, all_to_all_single or barrier) in front of `python`, the
    /// function with its full semantics.
    #[new]
    fn new(name: &str, python: Py<PyAny>) -> PyResult<Self> {
        let op = match name {
            "all_reduce" => Op::AllReduce,
            "broadcast" => Op::Broadcast,
            "all_gather_into_tensor" => Op::AllGatherIntoTensor,
            "reduce_scatter_tensor" => Op::ReduceScatterTensor,
            "all_to_all_single" => Op::AllToAllSingle,
            "barrier" => Op::Barrier,
            _ => return Err(PyValueError::new_err(format!("no fast path for {name:?}"))),
        };
        Ok(FastPath { op, python })
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let Ok(Some(call)) = self.ready(py, args, kwargs) else {
            return self.python.call(py, args, kwargs);
        };
        match run(py, call) {
            Ok(()) => Ok(py.None()),
            Err(e) => {
                // As the Python function's exception_logger would have.
                if let Some(st) = STATE.get(py) {
                    let name = self.python.getattr(py, intern!(py, "__name__"))?;
                    st.log.call1(py, (name, e.value(py)))?;
                }
                Err(e)
            }
        }
    }

    /// The Python function (inspect.signature follows it).
    #[getter]
    fn __wrapped__(&self, py: Python<'_>) -> Py<PyAny> {
        self.python.clone_ref(py)
    }

    #[getter]
    fn __doc__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.python.getattr(py, intern!(py, "__doc__"))
    }

    #[getter]
    fn __name__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.python.getattr(py, intern!(py, "__name__"))
    }

    #[getter]
    fn __qualname__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.python.getattr(py, intern!(py, "__qualname__"))
    }

    #[getter]
    fn __module__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.python.getattr(py, intern!(py, "__module__"))
    }

    /// Pickled by name, as functions are.
    fn __reduce__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.python.getattr(py, intern!(py, "__qualname__"))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "<rustdist function {}>",
            self.python.getattr(py, intern!(py, "__qualname__"))?
        ))
    }
}
