//! `_core.fast_function`: the usual synchronous call of a hot collective (a plain contiguous
//! CPU tensor, the default op, a rustdist group, no DETAIL checks) goes from Python straight
//! to the engine; any other call, and every error of the checks, goes to the Python function
//! it stands in for, which handles the rest of torch.distributed's semantics. The Python layer
//! costs about as much as the collective itself on small messages, which is why this exists.
//! The functions are builtins called with CPython's vectorcall convention (METH_FASTCALL):
//! arguments arrive as an array with the keywords' names, so a call builds no tuple, no dict
//! and no Python frame.

use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyList, PyString, PyTuple, PyType};

use crate::dlpack::{DenseBuffer, DlpackReader};
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

/// Every op, indexed by its discriminant.
const OPS: [Op; 6] = [
    Op::AllReduce,
    Op::Broadcast,
    Op::AllGatherIntoTensor,
    Op::ReduceScatterTensor,
    Op::AllToAllSingle,
    Op::Barrier,
];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::Broadcast => "broadcast",
            Op::AllGatherIntoTensor => "all_gather_into_tensor",
            Op::ReduceScatterTensor => "reduce_scatter_tensor",
            Op::AllToAllSingle => "all_to_all_single",
            Op::Barrier => "barrier",
        }
    }

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

/// The Python function each op stands in for (set by [`fast_function`]).
static PYTHON: [PyOnceLock<Py<PyAny>>; OPS.len()] = [const { PyOnceLock::new() }; OPS.len()];

/// The most parameters a fast-path function has.
const MAX_PARAMS: usize = 6;

/// Arguments bound to parameters by position.
type Bound6<'py> = [Option<Bound<'py, PyAny>>; MAX_PARAMS];

/// A vectorcall's arguments: the positional ones, then one value per keyword `kwnames` names.
struct Args<'a, 'py> {
    py: Python<'py>,
    ptrs: &'a [*mut ffi::PyObject],
    kwnames: Option<Bound<'py, PyTuple>>,
}

impl<'a, 'py> Args<'a, 'py> {
    /// How many are positional.
    fn positional(&self) -> usize {
        self.ptrs.len() - self.kwnames.as_ref().map_or(0, |k| k.len())
    }

    fn iter(&self) -> impl ExactSizeIterator<Item = Borrowed<'a, 'py, PyAny>> {
        let py = self.py;
        // SAFETY: CPython keeps every argument of a call alive until the call returns, and
        // `Args` lives no longer than the call.
        self.ptrs
            .iter()
            .map(move |&p| unsafe { Borrowed::from_ptr(py, p) })
    }
}

/// The call's arguments by parameter position; None when they do not bind plainly (too
/// many, unknown or repeated keywords: Python raises the right error).
fn bind<'py>(params: &[&str], args: &Args<'_, 'py>) -> Option<Bound6<'py>> {
    let positional = args.positional();
    if positional > params.len() {
        return None;
    }
    let mut bound: Bound6<'py> = Default::default();
    for (slot, arg) in bound.iter_mut().zip(args.iter().take(positional)) {
        *slot = Some(arg.to_owned());
    }
    for (key, value) in args
        .kwnames
        .iter()
        .flatten()
        .zip(args.iter().skip(positional))
    {
        let key = key.cast_into::<PyString>().ok()?;
        let key = key.to_str().ok()?;
        let i = params.iter().position(|p| *p == key)?;
        if bound[i].replace(value.to_owned()).is_some() {
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

/// `x` when it is a plain contiguous CPU tensor of a supported dtype.
fn cpu_tensor(st: &State, x: &Bound<'_, PyAny>) -> PyResult<Option<DenseBuffer>> {
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
    Ok(Some(DenseBuffer {
        ptr,
        numel,
        code,
        rows: None,
    }))
}

/// `x`'s (data pointer, element count, dtype code, device index) when it is a plain
/// contiguous CUDA tensor of a real dtype, read in one DLPack call (torch 2.10 and later);
/// None sends the caller to its Python checks, which also raise the errors.
#[pyfunction]
pub fn cuda_buffer(x: &Bound<'_, PyAny>) -> Option<(usize, usize, u8, i32)> {
    let st = STATE.get(x.py())?;
    if !x.get_type().is(st.tensor.bind(x.py())) {
        return None;
    }
    let (buf, device) = st.dlpack.as_ref()?.cuda_buffer(x)?;
    Some((buf.ptr, buf.numel, buf.code, device))
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

/// Whether tensor `x` (read as `buf`) has a dimension 0 that splits into `size` equal blocks
/// (else torch's error comes from Python). Asks torch only when the read did not tell; then
/// a 1-D tensor's rows are its elements, which saves building its shape.
fn rows_divide(x: &Bound<'_, PyAny>, buf: &DenseBuffer, size: usize) -> PyResult<bool> {
    let py = x.py();
    let rows = match buf.rows {
        Some(rows) => rows,
        None => match x.call_method0(intern!(py, "dim"))?.extract::<usize>()? {
            0 => None,
            1 => Some(buf.numel),
            _ => Some(
                x.getattr(intern!(py, "shape"))?
                    .cast::<PyTuple>()?
                    .get_item(0)?
                    .extract()?,
            ),
        },
    };
    Ok(rows.is_some_and(|rows| rows % size == 0))
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
    Ok(engine_group(st, &pg)?.map(|core| (pg, core)))
}

/// The engine group of `pg` when it is a rustdist group (exactly: subclasses go to Python).
fn engine_group<'py>(
    st: &State,
    pg: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyProcessGroup>>> {
    let py = pg.py();
    if !pg.get_type().is(st.group_class.bind(py)) {
        return Ok(None);
    }
    Ok(Some(
        pg.getattr(intern!(py, "_pg"))?
            .cast_into::<PyProcessGroup>()?,
    ))
}

/// Whether TORCH_DISTRIBUTED_DEBUG=DETAIL's checks are off (they run in Python).
fn checks_off(st: &State, py: Python<'_>) -> PyResult<bool> {
    let detail = st.debug.bind(py).get_item(intern!(py, "detail"))?;
    Ok(detail.is_some_and(|d| d.is(PyBool::new(py, false).as_any())))
}

/// all_gather_into_tensor (`gather`) or reduce_scatter_tensor on `core` of plain CPU tensors
/// whose sizes agree; None hands the call to Python.
fn gathered<'py>(
    st: &State,
    core: Bound<'py, PyProcessGroup>,
    gather: bool,
    out: &Bound<'py, PyAny>,
    inp: &Bound<'py, PyAny>,
) -> PyResult<Option<Ready<'py>>> {
    let (Some(o), Some(i)) = (cpu_tensor(st, out)?, cpu_tensor(st, inp)?) else {
        return Ok(None);
    };
    let (big, small) = if gather { (o, i) } else { (i, o) };
    if big.code != small.code || big.numel != core.get().size() * small.numel {
        return Ok(None);
    }
    Ok(Some(if gather {
        Ready::AllGather(core, small, big.ptr)
    } else {
        Ready::ReduceScatter(core, big.ptr, small)
    }))
}

/// A call that takes the fast path, with what the engine needs.
enum Ready<'py> {
    AllReduce(Bound<'py, PyProcessGroup>, DenseBuffer),
    Broadcast(Bound<'py, PyProcessGroup>, DenseBuffer, usize),
    AllGather(Bound<'py, PyProcessGroup>, DenseBuffer, usize),
    ReduceScatter(Bound<'py, PyProcessGroup>, usize, DenseBuffer),
    /// (group, output, input): blocks of equal size.
    AllToAll(Bound<'py, PyProcessGroup>, DenseBuffer, DenseBuffer),
    Barrier(Bound<'py, PyProcessGroup>),
}

/// The call of `op` with arguments `a`, when it is the usual kind; None hands it to Python
/// (also when a check fails with an error: Python raises the error torch.distributed would).
fn ready<'py>(op: Op, py: Python<'py>, a: &Bound6<'py>) -> PyResult<Option<Ready<'py>>> {
    let Some(st) = STATE.get(py) else {
        return Ok(None);
    };
    if !checks_off(st, py)? {
        return Ok(None);
    }
    Ok(match op {
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
            let gather = matches!(op, Op::AllGatherIntoTensor);
            let (op_ok, group, sync) = if gather {
                (true, &a[2], synchronous(&a[3]))
            } else {
                (is_sum(st, &a[2])?, &a[3], synchronous(&a[4]))
            };
            let (Some(out), Some(inp), true, true) = (given(&a[0]), given(&a[1]), op_ok, sync)
            else {
                return Ok(None);
            };
            match rustdist_group(st, py, group)? {
                Some((_, core)) => gathered(st, core, gather, out, inp)?,
                None => None,
            }
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
            let equal = o.numel == i.numel && o.code == i.code;
            (equal && rows_divide(out, &o, size)? && rows_divide(inp, &i, size)?)
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

/// Runs a call that took the fast path, synchronously, on the engine.
fn run(py: Python<'_>, call: Ready<'_>) -> PyResult<()> {
    let none = || py.None();
    match call {
        Ready::AllReduce(core, t) => {
            core.get()
                .all_reduce(py, t.ptr, t.numel, t.code, 0, none(), None, true)?;
        }
        Ready::Broadcast(core, t, root) => {
            core.get()
                .broadcast(py, t.ptr, t.numel, t.code, root, none(), true)?;
        }
        Ready::AllGather(core, input, out) => {
            let outputs = GatherOutputs::Contiguous(out);
            core.get().all_gather(
                py,
                input.ptr,
                outputs,
                input.numel,
                input.code,
                none(),
                true,
            )?;
        }
        Ready::ReduceScatter(core, input, out) => {
            core.get().reduce_scatter(
                py,
                input,
                out.ptr,
                out.numel,
                out.code,
                0,
                none(),
                None,
                true,
            )?;
        }
        Ready::AllToAll(core, out, inp) => {
            let count = (out.numel / core.get().size()) as u64;
            let sends = ExchangeBlocks::Uniform(inp.ptr);
            let recvs = ExchangeBlocks::Uniform(out.ptr);
            core.get().exchange(
                py,
                "all_to_all",
                out.code,
                count,
                sends,
                recvs,
                none(),
                true,
            )?;
        }
        Ready::Barrier(core) => {
            core.get().barrier(py, true)?;
        }
    }
    Ok(())
}

/// The call of `op` with `args`, on the fast path or through its Python function.
fn call(op: Op, args: &Args<'_, '_>) -> PyResult<Py<PyAny>> {
    let py = args.py;
    let bound = bind(op.params(), args);
    let Some(Ok(Some(ready))) = bound.as_ref().map(|a| ready(op, py, a)) else {
        return fallback(&PYTHON[op as usize], op.name(), args);
    };
    run_logged(py, op, ready)
}

/// Runs `ready` (a call of `op`); None, or its error logged as the Python function's
/// exception_logger would have.
fn run_logged(py: Python<'_>, op: Op, ready: Ready<'_>) -> PyResult<Py<PyAny>> {
    match run(py, ready) {
        Ok(()) => Ok(py.None()),
        Err(e) => {
            if let Some(st) = STATE.get(py) {
                st.log.call1(py, (op.name(), e.value(py)))?;
            }
            Err(e)
        }
    }
}

/// The call handed to `python` (the function behind fast path `name`), as a tuple and a dict.
fn fallback(
    python: &PyOnceLock<Py<PyAny>>,
    name: &str,
    args: &Args<'_, '_>,
) -> PyResult<Py<PyAny>> {
    let py = args.py;
    let python = python
        .get(py)
        .ok_or_else(|| PyValueError::new_err(format!("the fast path of {name} is not set up")))?;
    let positional = args.positional();
    let tuple = PyTuple::new(py, args.iter().take(positional))?;
    let kwargs = match &args.kwnames {
        Some(names) => {
            let dict = PyDict::new(py);
            for (name, value) in names.iter().zip(args.iter().skip(positional)) {
                dict.set_item(name, value)?;
            }
            Some(dict)
        }
        None => None,
    };
    python.call(py, tuple, kwargs.as_ref())
}

/// CPython's entry for op number `OP` (METH_FASTCALL | METH_KEYWORDS): `nargs` positional
/// arguments at `args`, then one value per name in `kwnames` (a tuple, or null).
unsafe extern "C" fn vectorcall<const OP: usize>(
    _module: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a builtin with this thread attached and the arguments live.
    unsafe { entry(args, nargs, kwnames, |a| call(OPS[OP], a)) }
}

/// CPython's entry for method number `M`, called with the group first, as [`vectorcall`].
unsafe extern "C" fn method_vectorcall<const M: usize>(
    _module: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: as for `vectorcall`.
    unsafe { entry(args, nargs, kwnames, |a| call_method(METHODS[M], a)) }
}

/// The body of a vectorcall entry: `body` on the arguments, its error (or panic) set as the
/// Python error.
///
/// # Safety
/// The caller is CPython calling a METH_FASTCALL | METH_KEYWORDS builtin: this thread is
/// attached, `args` holds `nargs` positional arguments and one per name of `kwnames` (a tuple
/// of str, or null), all alive for the call.
unsafe fn entry(
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
    body: impl FnOnce(&Args<'_, '_>) -> PyResult<Py<PyAny>>,
) -> *mut ffi::PyObject {
    // The thread is attached (CPython calls builtins so), but pyo3 counts it as attached only
    // inside `attach`: outside, every dropped `Py` goes through its deferred-decref pool.
    // SAFETY: the caller's guarantees, passed on.
    Python::attach(|py| unsafe { entered(py, args, nargs, kwnames, body) })
}

/// [`entry`] with the thread counted as attached.
///
/// # Safety
/// As for [`entry`].
unsafe fn entered(
    py: Python<'_>,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
    body: impl FnOnce(&Args<'_, '_>) -> PyResult<Py<PyAny>>,
) -> *mut ffi::PyObject {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: kwnames is null or a tuple of str that CPython keeps alive for the call.
        let kwnames = unsafe { Borrowed::from_ptr_or_opt(py, kwnames) }
            .map(|k| k.to_owned().cast_into::<PyTuple>())
            .transpose()?;
        let total = usize::try_from(nargs).unwrap_or(0) + kwnames.as_ref().map_or(0, |k| k.len());
        let ptrs = if total == 0 {
            &[]
        } else {
            // SAFETY: `args` holds `total` references, live for the call (METH_FASTCALL).
            unsafe { std::slice::from_raw_parts(args, total) }
        };
        body(&Args { py, ptrs, kwnames })
    }));
    let error = match outcome {
        Ok(Ok(value)) => return value.into_ptr(),
        Ok(Err(e)) => e,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic in rustdist's fast path".into());
            PanicException::new_err(what)
        }
    };
    error.restore(py);
    std::ptr::null_mut()
}

/// Each op's entry, indexed as [`OPS`].
const ENTRIES: [ffi::PyCFunctionFastWithKeywords; OPS.len()] = [
    vectorcall::<0>,
    vectorcall::<1>,
    vectorcall::<2>,
    vectorcall::<3>,
    vectorcall::<4>,
    vectorcall::<5>,
];

/// The fast function of `name` in front of `python`, the function with its full semantics: a
/// builtin of module `module` whose docstring is `doc` (its first lines may give the
/// signature, `name(params)\n--\n\n`, as CPython's builtins do). `name` is one of all_reduce,
/// broadcast, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single or barrier; with
/// `method`, one of the methods of rustdist's torch ProcessGroup that torch's synchronous
/// calls reach (allreduce, broadcast, _allgather_base, _reduce_scatter_base or barrier), and
/// the builtin is called with the group first. (A builtin as the method itself would hide it
/// from torch's C++ callers: pybind11 takes any builtin attribute for its own C++ method, not
/// for an override.)
#[pyfunction]
#[pyo3(signature = (name, python, module, doc, method = false))]
pub fn fast_function(
    py: Python<'_>,
    name: &str,
    python: Py<PyAny>,
    module: &str,
    doc: &str,
    method: bool,
) -> PyResult<Py<PyAny>> {
    let (index, pythons, entries) = if method {
        let index = METHODS.iter().position(|m| m.name() == name);
        (index, &PYTHON_METHODS[..], &METHOD_ENTRIES[..])
    } else {
        let index = OPS.iter().position(|op| op.name() == name);
        (index, &PYTHON[..], &ENTRIES[..])
    };
    let Some(index) = index else {
        return Err(PyValueError::new_err(format!("no fast path for {name:?}")));
    };
    let _ = pythons[index].set(py, python);
    let def = leaked_def(name, entries[index], doc)?;
    let module = PyString::new(py, module);
    // SAFETY: `def` lives forever; a null self makes a plain function; `module` is a live str
    // (the function holds its own reference).
    let function = unsafe { ffi::PyCFunction_NewEx(def, std::ptr::null_mut(), module.as_ptr()) };
    // SAFETY: a new reference, or null with a Python error set.
    Ok(unsafe { Bound::from_owned_ptr_or_err(py, function) }?.unbind())
}

/// A vectorcall builtin's definition. CPython keeps a pointer to it for the function's whole
/// life; one per fast path and setup (a handful per process), so it is leaked on purpose.
fn leaked_def(
    name: &str,
    entry: ffi::PyCFunctionFastWithKeywords,
    doc: &str,
) -> PyResult<&'static mut ffi::PyMethodDef> {
    let text = |s: &str| {
        CString::new(s).map_err(|_| PyValueError::new_err("a name or docstring with a NUL byte"))
    };
    Ok(Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: text(name)?.into_raw(),
        ml_meth: ffi::PyMethodDefPointer {
            PyCFunctionFastWithKeywords: entry,
        },
        ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
        ml_doc: text(doc)?.into_raw(),
    })))
}

/// A method that torch's Python API calls on a rustdist group (the torch front door) with
/// torch's option objects. Its usual synchronous call (`opts.asyncOp` False) runs here and
/// returns None, which torch reads as "the backend has synchronised": no Work is made and
/// none is waited for.
#[derive(Clone, Copy)]
enum Method {
    AllReduce,
    Broadcast,
    AllGatherBase,
    ReduceScatterBase,
    Barrier,
}

/// Every method, indexed by its discriminant.
const METHODS: [Method; 5] = [
    Method::AllReduce,
    Method::Broadcast,
    Method::AllGatherBase,
    Method::ReduceScatterBase,
    Method::Barrier,
];

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::AllReduce => "allreduce",
            Method::Broadcast => "broadcast",
            Method::AllGatherBase => "_allgather_base",
            Method::ReduceScatterBase => "_reduce_scatter_base",
            Method::Barrier => "barrier",
        }
    }

    /// The collective it runs (its name is what a failure is logged as).
    fn op(self) -> Op {
        match self {
            Method::AllReduce => Op::AllReduce,
            Method::Broadcast => Op::Broadcast,
            Method::AllGatherBase => Op::AllGatherIntoTensor,
            Method::ReduceScatterBase => Op::ReduceScatterTensor,
            Method::Barrier => Op::Barrier,
        }
    }

    /// The Python method's parameters after `self`, in order; the options come last.
    fn params(self) -> &'static [&'static str] {
        match self {
            Method::AllReduce | Method::Broadcast => &["tensors", "opts"],
            Method::AllGatherBase | Method::ReduceScatterBase => &["output", "input", "opts"],
            Method::Barrier => &["opts"],
        }
    }
}

/// The Python method each method stands in for (set by [`fast_function`]).
static PYTHON_METHODS: [PyOnceLock<Py<PyAny>>; METHODS.len()] =
    [const { PyOnceLock::new() }; METHODS.len()];

/// Each method's entry, indexed as [`METHODS`].
const METHOD_ENTRIES: [ffi::PyCFunctionFastWithKeywords; METHODS.len()] = [
    method_vectorcall::<0>,
    method_vectorcall::<1>,
    method_vectorcall::<2>,
    method_vectorcall::<3>,
    method_vectorcall::<4>,
];

/// The tensor of `tensors`, a list of one tensor or a tensor.
fn one_tensor<'py>(st: &State, tensors: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    if tensors.get_type().is(st.tensor.bind(tensors.py())) {
        return Ok(Some(tensors.clone()));
    }
    match tensors.cast::<PyList>() {
        Ok(list) if list.len() == 1 => Ok(Some(list.get_item(0)?)),
        _ => Ok(None),
    }
}

/// The call of method `m` on `group` with arguments `a`, when it is the usual synchronous
/// kind; None hands it to Python.
fn ready_method<'py>(
    m: Method,
    st: &State,
    group: &Bound<'py, PyAny>,
    a: &Bound6<'py>,
) -> PyResult<Option<Ready<'py>>> {
    let py = group.py();
    let Some(opts) = given(&a[m.params().len() - 1]) else {
        return Ok(None);
    };
    // A bare ReduceOp in place of the options (Python callers) has no asyncOp.
    let Ok(async_op) = opts.getattr(intern!(py, "asyncOp")) else {
        return Ok(None);
    };
    if !async_op.is(PyBool::new(py, false).as_any()) || !checks_off(st, py)? {
        return Ok(None);
    }
    let Some(core) = engine_group(st, group)? else {
        return Ok(None);
    };
    let sum = |opts: &Bound<'py, PyAny>| is_sum(st, &Some(opts.getattr(intern!(py, "reduceOp"))?));
    Ok(match m {
        Method::AllReduce | Method::Broadcast => {
            let Some(t) = given(&a[0])
                .map(|t| one_tensor(st, t))
                .transpose()?
                .flatten()
            else {
                return Ok(None);
            };
            let Some(buf) = cpu_tensor(st, &t)? else {
                return Ok(None);
            };
            if matches!(m, Method::AllReduce) {
                sum(opts)?.then_some(Ready::AllReduce(core, buf))
            } else {
                let root: usize = opts.getattr(intern!(py, "rootRank"))?.extract()?;
                let tensor: usize = opts.getattr(intern!(py, "rootTensor"))?.extract()?;
                (tensor == 0 && root < core.get().size())
                    .then_some(Ready::Broadcast(core, buf, root))
            }
        }
        Method::AllGatherBase | Method::ReduceScatterBase => {
            let gather = matches!(m, Method::AllGatherBase);
            let (Some(out), Some(inp)) = (given(&a[0]), given(&a[1])) else {
                return Ok(None);
            };
            if !gather && !sum(opts)? {
                return Ok(None);
            }
            gathered(st, core, gather, out, inp)?
        }
        Method::Barrier => {
            // torch's barrier(timeout=...) sets a timeout of the call (unset: negative, -1 ms);
            // the Python method applies it.
            let timeout = opts.getattr(intern!(py, "timeout"))?;
            let days: i64 = timeout.getattr(intern!(py, "days"))?.extract()?;
            (days < 0).then_some(Ready::Barrier(core))
        }
    })
}

/// The call of method `m` with `args` (the group first), on the fast path or through its
/// Python method.
fn call_method(m: Method, args: &Args<'_, '_>) -> PyResult<Py<PyAny>> {
    let py = args.py;
    let ready = match (STATE.get(py), args.iter().next(), args.positional() > 0) {
        (Some(st), Some(group), true) => {
            let rest = Args {
                py,
                ptrs: &args.ptrs[1..],
                kwnames: args.kwnames.clone(),
            };
            match bind(m.params(), &rest) {
                Some(a) => ready_method(m, st, &group.to_owned(), &a),
                None => Ok(None),
            }
        }
        _ => Ok(None),
    };
    let Ok(Some(ready)) = ready else {
        return fallback(&PYTHON_METHODS[m as usize], m.name(), args);
    };
    run_logged(py, m.op(), ready)
}
