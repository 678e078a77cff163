//! Reading a fast call's arguments: a tensor as a plain contiguous CPU (or CUDA) buffer, its
//! rows, the reduce op, the rustdist group, and whether TORCH_DISTRIBUTED_DEBUG=DETAIL's
//! checks are on. None from a reader hands the call to Python.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple};

use super::args::given;
use super::state::{State, STATE};
use crate::dlpack::DenseBuffer;
use crate::group::PyProcessGroup;

/// `x` when it is a plain contiguous CPU tensor of a supported dtype.
pub(super) fn cpu_tensor(st: &State, x: &Bound<'_, PyAny>) -> PyResult<Option<DenseBuffer>> {
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

/// `x`'s (data pointer, element count, dtype code) when it is a plain contiguous CPU tensor
/// of a supported dtype (read as the fast collectives read theirs); None otherwise, or before
/// `fast_init`.
pub fn cpu_dense(x: &Bound<'_, PyAny>) -> Option<(usize, usize, u8)> {
    let st = STATE.get(x.py())?;
    let buf = cpu_tensor(st, x).ok().flatten()?;
    Some((buf.ptr, buf.numel, buf.code))
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
pub(super) fn rows_divide(x: &Bound<'_, PyAny>, buf: &DenseBuffer, size: usize) -> PyResult<bool> {
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
pub(super) fn is_sum(st: &State, op: &Option<Bound<'_, PyAny>>) -> PyResult<bool> {
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
pub(super) fn rustdist_group<'py>(
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

/// The engine group of `pg` when it is a rustdist group (exactly: subclasses go to Python)
/// with no collective hooks registered.
pub(super) fn engine_group<'py>(
    st: &State,
    pg: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyProcessGroup>>> {
    let py = pg.py();
    if !pg.get_type().is(st.group_class.bind(py)) {
        return Ok(None);
    }
    let core = pg
        .getattr(intern!(py, "_pg"))?
        .cast_into::<PyProcessGroup>()?;
    // A group with collective hooks: Python fires them around the call.
    Ok((!core.get().hooked()).then_some(core))
}

/// Whether TORCH_DISTRIBUTED_DEBUG=DETAIL's checks are off and no profiler records (both
/// run in Python).
pub(super) fn checks_off(st: &State, py: Python<'_>) -> PyResult<bool> {
    let off = |namespace: &Py<PyDict>, flag| -> PyResult<bool> {
        let value = namespace.bind(py).get_item(flag)?;
        Ok(value.is_some_and(|v| v.is(PyBool::new(py, false).as_any())))
    };
    Ok(off(&st.debug, intern!(py, "detail"))?
        && off(&st.profiler, intern!(py, "_is_profiler_enabled"))?)
}
