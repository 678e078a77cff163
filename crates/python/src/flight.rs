//! The flight recorder's Python side: where dumps go and under which rank, the group names
//! torch knows, (under `TORCH_INCLUDE_STACK_TRACE=1`) the Python stack each operation was
//! issued from, and the status query that asks running ranks what they are doing.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::prelude::*;
use rustdist_core::auth::AuthKey;
use rustdist_core::recorder::{self, Frame};
use rustdist_core::transport::heartbeat::ask_status as ask_status_of;

use crate::error::PyDistError;

/// Whether operations record their Python stack: `TORCH_INCLUDE_STACK_TRACE` (torch's
/// variable) set to 1 or true. Off by default: walking the stack costs microseconds.
fn stacks_wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    *WANTED.get_or_init(|| {
        std::env::var("TORCH_INCLUDE_STACK_TRACE")
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
    })
}

/// The Python stack of the caller, innermost first.
fn stack(py: Python<'_>) -> PyResult<Vec<Frame>> {
    let mut frames = Vec::new();
    let mut frame = py.import("sys")?.call_method1("_getframe", (0,))?;
    while !frame.is_none() {
        let code = frame.getattr("f_code")?;
        frames.push(Frame {
            name: code.getattr("co_name")?.extract()?,
            filename: code.getattr("co_filename")?.extract()?,
            line: frame.getattr("f_lineno")?.extract().unwrap_or(0),
        });
        frame = frame.getattr("f_back")?;
    }
    Ok(frames)
}

/// Notes the caller's Python stack for the next operation this thread issues, when stacks
/// are asked for.
pub fn note_stack(py: Python<'_>) {
    if stacks_wanted() {
        // A stack that cannot be read is left out, never an error of the operation.
        if let Ok(frames) = stack(py) {
            recorder::set_next_frames(frames);
        }
    }
}

/// Sets this process's global rank, which names its dump file.
#[pyfunction]
fn flight_recorder_set_rank(rank: usize) {
    recorder::set_global_rank(rank);
}

/// Writes every group's flight recorder to `prefix` (default `TORCH_FR_DUMP_TEMP_FILE`, as
/// torch reads it) followed by the global rank; returns the file's path.
#[pyfunction]
#[pyo3(signature = (prefix = None))]
fn flight_recorder_dump(py: Python<'_>, prefix: Option<String>) -> PyResult<String> {
    let path = py
        .detach(|| recorder::dump(prefix.as_deref()))
        .map_err(|e| PyDistError(rustdist_core::Error::Runtime(e.to_string())))?;
    Ok(path.display().to_string())
}

/// Dumps as after a failure (`why` is logged): when recording is on and the rank is known;
/// a failure to write is logged, never raised. The front doors call it after a user's abort.
#[pyfunction]
fn flight_recorder_dump_after(py: Python<'_>, why: &str) {
    py.detach(|| recorder::dump_after_failure(why));
}

/// The entries each group keeps (`TORCH_FR_BUFFER_SIZE`; 0: recording off).
#[pyfunction]
fn flight_recorder_capacity() -> usize {
    recorder::capacity()
}

/// Asks the ranks whose heartbeats answer at `addrs` ("host:port") what their processes are
/// doing; returns each answer (JSON) by position, None where none came within `timeout`
/// seconds. Signs the queries with RUSTDIST_AUTH_KEY when it is set.
#[pyfunction]
fn ask_status(py: Python<'_>, addrs: Vec<String>, timeout: f64) -> PyResult<Vec<Option<String>>> {
    let parsed = addrs
        .iter()
        .map(|a| {
            a.parse().map_err(|e| {
                PyDistError(rustdist_core::Error::invalid(format!(
                    "status address {a:?}: {e}"
                )))
            })
        })
        .collect::<Result<Vec<SocketAddr>, PyDistError>>()?;
    let key = AuthKey::from_env();
    let within = Duration::from_secs_f64(timeout.max(0.0));
    Ok(py
        .detach(|| ask_status_of(&parsed, key.as_ref(), within))
        .map_err(PyDistError)?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ask_status, m)?)?;
    m.add_function(wrap_pyfunction!(flight_recorder_set_rank, m)?)?;
    m.add_function(wrap_pyfunction!(flight_recorder_dump, m)?)?;
    m.add_function(wrap_pyfunction!(flight_recorder_dump_after, m)?)?;
    m.add_function(wrap_pyfunction!(flight_recorder_capacity, m)?)?;
    Ok(())
}
