//! Ctrl-C during a blocking call: the core polls the hook installed here, which asks Python
//! for pending signals (with the GIL briefly re-acquired). The signal handler's exception
//! (KeyboardInterrupt, or whatever a user handler raised) is kept for the blocked call to
//! raise once it returns `Error::Interrupted`.

use std::cell::RefCell;

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use rustdist_core::{interrupt, Error};

thread_local! {
    /// The exception a signal handler raised during this thread's blocked call.
    static PENDING: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

fn signals_pending() -> bool {
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(e) => {
            PENDING.with(|p| *p.borrow_mut() = Some(e));
            true
        }
    })
}

/// Installs the hook (once, when the module loads).
pub fn install() {
    interrupt::install(signals_pending);
}

/// The exception to raise for an interrupted call: the signal handler's.
pub fn take_pending() -> PyErr {
    PENDING
        .with(|p| p.borrow_mut().take())
        .unwrap_or_else(|| PyKeyboardInterrupt::new_err(""))
}

/// Keeps a Python exception raised inside a store callback (e.g. KeyboardInterrupt from a
/// torch store) as the pending one, so it comes out unchanged; other errors become
/// `Error::Store` with `describe`'s message.
pub fn from_py(py: Python<'_>, e: PyErr, describe: impl FnOnce(&PyErr) -> String) -> Error {
    if e.is_instance_of::<PyKeyboardInterrupt>(py) {
        PENDING.with(|p| *p.borrow_mut() = Some(e));
        return Error::Interrupted;
    }
    Error::store(describe(&e))
}

/// Runs `f` with the GIL released and interruption enabled on this thread. The error stays a
/// core one (`?` in a `CoreResult` binding converts it), so this module sits below `error`.
pub fn blocking<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> rustdist_core::Result<T> + Send,
) -> rustdist_core::Result<T> {
    py.detach(|| {
        let _on = interrupt::enable();
        f()
    })
}
