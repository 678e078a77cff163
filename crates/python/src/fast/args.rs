//! A vectorcall's arguments (the positional ones, then one per keyword name) and their
//! binding to a fast function's parameters.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString, PyTuple};

/// The most parameters a fast-path function has.
const MAX_PARAMS: usize = 6;

/// Arguments bound to parameters by position.
pub(super) type Bound6<'py> = [Option<Bound<'py, PyAny>>; MAX_PARAMS];

/// A vectorcall's arguments: the positional ones, then one value per keyword `kwnames` names.
pub(super) struct Args<'a, 'py> {
    pub(super) py: Python<'py>,
    pub(super) ptrs: &'a [*mut ffi::PyObject],
    pub(super) kwnames: Option<Bound<'py, PyTuple>>,
}

impl<'a, 'py> Args<'a, 'py> {
    /// How many are positional.
    pub(super) fn positional(&self) -> usize {
        self.ptrs.len() - self.kwnames.as_ref().map_or(0, |k| k.len())
    }

    pub(super) fn iter(&self) -> impl ExactSizeIterator<Item = Borrowed<'a, 'py, PyAny>> {
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
pub(super) fn bind<'py>(params: &[&str], args: &Args<'_, 'py>) -> Option<Bound6<'py>> {
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
pub(super) fn given<'a, 'py>(arg: &'a Option<Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    arg.as_ref().filter(|a| !a.is_none())
}

/// Whether the call is asynchronous: `async_op` True, or absent or False; None for any other
/// value (Python decides what it means).
pub(super) fn async_op(arg: &Option<Bound<'_, PyAny>>) -> Option<bool> {
    let Some(a) = arg else {
        return Some(false);
    };
    [false, true]
        .into_iter()
        .find(|&b| a.is(PyBool::new(a.py(), b).as_any()))
}
