//! `_core.fast_function`: the usual call of a hot collective (a plain contiguous CPU tensor,
//! the default op, a rustdist group, no DETAIL checks; synchronous, or asynchronous with its
//! Work made by the Python side's maker) goes from Python straight to the engine; any other call, and every error of the checks, goes to the Python function
//! it stands in for, which handles the rest of torch.distributed's semantics. The Python layer
//! costs about as much as the collective itself on small messages, which is why this exists.
//! The functions are builtins called with CPython's vectorcall convention (METH_FASTCALL):
//! arguments arrive as an array with the keywords' names, so a call builds no tuple, no dict
//! and no Python frame.
//!
//! The pieces, each in its own file, with imports running one way (a module uses only those
//! listed before it): `args` (a vectorcall's arguments, bound to parameters) and `state`
//! (what `fast_init` sets up) use none of the others; `read` (reading a call's tensors, op,
//! group and debug flag) uses `args` and `state`; `ops` (the fast functions: which calls
//! qualify, running them, handing the rest to Python) uses `args`, `state` and `read`;
//! `methods` (the same for the torch ProcessGroup's methods) uses all of those; this file
//! (the vectorcall entries and `fast_function`, which makes the builtins) uses `args`, `ops`
//! and `methods`, and re-exports the `#[pyfunction]`s `lib.rs` registers.

mod args;
mod methods;
mod ops;
mod read;
mod state;

pub use read::{cpu_dense, cuda_buffer};
pub use state::fast_init;

use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use args::Args;
use methods::{call_method, METHODS, PYTHON_METHODS};
use ops::{call, OPS, PYTHON};

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
/// `method`, one of the methods of rustdist's torch ProcessGroup that torch's hot calls
/// reach (allreduce, broadcast, _allgather_base, _reduce_scatter_base or barrier), and
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

/// Each method's entry, indexed as [`METHODS`].
const METHOD_ENTRIES: [ffi::PyCFunctionFastWithKeywords; METHODS.len()] = [
    method_vectorcall::<0>,
    method_vectorcall::<1>,
    method_vectorcall::<2>,
    method_vectorcall::<3>,
    method_vectorcall::<4>,
];
