//! Store pyclasses (TCPStore, FileStore, HashStore, PrefixStore) and the adapter that lets a
//! Python store object (e.g. torch's) serve the core.
//!
//! Timeouts are accepted as `datetime.timedelta` (torch) or float seconds and reported as
//! `timedelta`; values as `str`, `bytes` or `bytearray`; `get` returns `bytes`.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass_init::PyClassInitializer;
use pyo3::types::{PyByteArray, PyBytes, PyString};
use rustdist_core::store::{
    FileStore, HashStore, PrefixStore, Store, TcpStore, TcpStoreOptions, DEFAULT_TIMEOUT,
};

use crate::error::PyDistError;
use crate::interrupt;

/// `datetime.timedelta.max` in seconds (rounded down).
const MAX_TIMEDELTA_SECS: f64 = 86_399_999_999_999.0;

/// Runs a store call with the GIL released; Ctrl-C interrupts it.
fn blocking<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> rustdist_core::Result<T> + Send,
) -> PyResult<T> {
    Ok(interrupt::blocking(py, f).map_err(PyDistError)?)
}

/// A timeout given as `timedelta` or seconds.
fn duration_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let secs: f64 = if obj.hasattr("total_seconds")? {
        obj.call_method0("total_seconds")?.extract()?
    } else {
        obj.extract()?
    };
    if secs.is_nan() || secs < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a non-negative timedelta or number of seconds, got {secs}"
        )));
    }
    Ok(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

fn duration_to_py(py: Python<'_>, d: Duration) -> PyResult<Bound<'_, PyAny>> {
    let secs = d.as_secs_f64().min(MAX_TIMEDELTA_SECS);
    py.import("datetime")?
        .getattr("timedelta")?
        .call1((0, secs))
}

/// A store value: `bytes`, `bytearray` or `str` (UTF-8).
fn value_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        Ok(b.as_bytes().to_vec())
    } else if let Ok(s) = obj.cast::<PyString>() {
        Ok(s.to_cow()?.as_bytes().to_vec())
    } else if let Ok(b) = obj.cast::<PyByteArray>() {
        Ok(b.to_vec())
    } else {
        Err(PyTypeError::new_err(format!(
            "store values must be str or bytes, not {}",
            obj.get_type().name()?
        )))
    }
}

/// Base class of every store (torch's `Store`); not constructible itself.
#[pyclass(subclass, frozen, module = "rustdist._core", name = "Store")]
pub struct PyStore {
    inner: Arc<dyn Store>,
}

#[pymethods]
impl PyStore {
    /// Inserts `key` with `value` (str or bytes), replacing any old value.
    fn set(&self, py: Python<'_>, key: String, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_bytes(value)?;
        blocking(py, || self.inner.set(&key, &value))
    }

    /// Returns the value of `key`, waiting up to the store's timeout for it to be set; raises
    /// DistStoreError when the timeout passes.
    fn get<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyBytes>> {
        let v = blocking(py, || self.inner.get(&key, None))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Adds `value` to the integer counter at `key` (created at 0) and returns the new value.
    fn add(&self, py: Python<'_>, key: String, value: i64) -> PyResult<i64> {
        blocking(py, || self.inner.add(&key, value))
    }

    /// Appends `value` to the value of `key`, creating it when absent.
    fn append(&self, py: Python<'_>, key: String, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_bytes(value)?;
        blocking(py, || self.inner.append(&key, &value))
    }

    /// True when every key in `keys` is set; does not wait.
    fn check(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<bool> {
        blocking(py, || self.inner.check(&keys))
    }

    /// Sets `key` to `desired_value` when its value equals `expected_value` (or when it is
    /// absent and `expected_value` is empty); returns the value now held (`expected_value`
    /// when the key is absent and nothing was set).
    fn compare_set<'py>(
        &self,
        py: Python<'py>,
        key: String,
        expected_value: &Bound<'py, PyAny>,
        desired_value: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let expected = value_bytes(expected_value)?;
        let desired = value_bytes(desired_value)?;
        let v = blocking(py, || self.inner.compare_set(&key, &expected, &desired))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Deletes `key`; True when it existed.
    fn delete_key(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        blocking(py, || self.inner.delete_key(&key))
    }

    /// The values of `keys`, waiting up to the store's timeout for all of them.
    fn multi_get<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let vs = blocking(py, || self.inner.multi_get(&keys, None))?;
        Ok(vs.iter().map(|v| PyBytes::new(py, v)).collect())
    }

    /// Sets every `keys[i]` to `values[i]`.
    fn multi_set(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let values = values
            .iter()
            .map(value_bytes)
            .collect::<PyResult<Vec<_>>>()?;
        blocking(py, || self.inner.multi_set(&keys, &values))
    }

    /// The number of keys set (rustdist counts no internal keys, unlike torch's TCPStore).
    fn num_keys(&self, py: Python<'_>) -> PyResult<i64> {
        blocking(py, || self.inner.num_keys())
    }

    /// Waits until every key in `keys` is set, up to `timeout` (default: the store's);
    /// raises DistStoreError naming the missing keys when it passes.
    #[pyo3(signature = (keys, timeout = None))]
    fn wait(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let timeout = timeout.map(duration_from_py).transpose()?;
        blocking(py, || self.inner.wait(&keys, timeout))
    }

    /// Sets the store's default timeout (a timedelta or seconds).
    fn set_timeout(&self, timeout: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.set_timeout(duration_from_py(timeout)?);
        Ok(())
    }

    /// The store's default timeout, as a `datetime.timedelta`.
    #[getter]
    fn timeout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        duration_to_py(py, self.inner.timeout())
    }
}

fn base(inner: Arc<dyn Store>) -> PyClassInitializer<PyStore> {
    PyClassInitializer::from(PyStore { inner })
}

/// A store served over TCP by the master (`is_master=True`) to every client (torch's
/// `TCPStore`). `port=0` on the master binds a free port (see `.port`). The master listens on
/// `host_name` when that is one of this machine's addresses, else on every interface. With
/// `RUSTDIST_AUTH_KEY` set, server and clients authenticate each other (a missing or wrong key
/// raises DistNetworkError "authentication failed"). `use_libuv` is accepted for
/// compatibility and ignored.
#[pyclass(extends = PyStore, frozen, module = "rustdist._core", name = "TCPStore")]
pub struct PyTcpStore {
    host: String,
    port: u16,
}

#[pymethods]
impl PyTcpStore {
    #[new]
    #[pyo3(signature = (
        host_name,
        port,
        world_size = None,
        is_master = false,
        timeout = None,
        wait_for_workers = true,
        multi_tenant = false,
        master_listen_fd = None,
        use_libuv = true,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host_name: String,
        port: u16,
        world_size: Option<i64>,
        is_master: bool,
        timeout: Option<&Bound<'_, PyAny>>,
        wait_for_workers: bool,
        multi_tenant: bool,
        master_listen_fd: Option<i32>,
        use_libuv: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let _ = use_libuv; // torch's choice of server backend; rustdist has one
        let opts = TcpStoreOptions {
            host: host_name,
            port,
            world_size: world_size.and_then(|n| usize::try_from(n).ok()),
            is_master,
            timeout: timeout
                .map(duration_from_py)
                .transpose()?
                .unwrap_or(DEFAULT_TIMEOUT),
            wait_for_workers,
            multi_tenant,
            master_listen_fd,
            ..TcpStoreOptions::default()
        };
        let store = blocking(py, || TcpStore::new(opts))?;
        let sub = PyTcpStore {
            host: store.host().to_owned(),
            port: store.port(),
        };
        Ok(base(Arc::new(store)).add_subclass(sub))
    }

    /// The host name clients connect to.
    #[getter]
    fn host(&self) -> &str {
        &self.host
    }

    /// The port the store listens on (the bound one when created with port 0).
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }
}

/// A store shared by processes through a file (torch's `FileStore`). With `world_size > 0`
/// the file is deleted once that many FileStore objects using it have been destroyed.
#[pyclass(extends = PyStore, frozen, module = "rustdist._core", name = "FileStore")]
pub struct PyFileStore {
    path: String,
}

#[pymethods]
impl PyFileStore {
    #[new]
    #[pyo3(signature = (file_name, world_size = -1))]
    fn new(
        py: Python<'_>,
        file_name: String,
        world_size: i64,
    ) -> PyResult<PyClassInitializer<Self>> {
        let store = blocking(py, || FileStore::new(&file_name, world_size))?;
        Ok(base(Arc::new(store)).add_subclass(PyFileStore { path: file_name }))
    }

    /// The path of the file.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }
}

/// A thread-safe store within one process (torch's `HashStore`).
#[pyclass(extends = PyStore, frozen, module = "rustdist._core", name = "HashStore")]
pub struct PyHashStore;

#[pymethods]
impl PyHashStore {
    #[new]
    fn new() -> PyClassInitializer<Self> {
        base(Arc::new(HashStore::new())).add_subclass(PyHashStore)
    }
}

/// A wrapper adding `prefix + "/"` to every key of `store` (torch's `PrefixStore`).
/// `store` is any rustdist store or an object with torch's Store methods.
#[pyclass(extends = PyStore, frozen, module = "rustdist._core", name = "PrefixStore")]
pub struct PyPrefixStore {
    underlying: Py<PyAny>,
}

#[pymethods]
impl PyPrefixStore {
    #[new]
    fn new(prefix: String, store: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let inner = store_from_py(store)?;
        let sub = PyPrefixStore {
            underlying: store.clone().unbind(),
        };
        Ok(base(Arc::new(PrefixStore::new(prefix, inner))).add_subclass(sub))
    }

    /// The store this one wraps.
    #[getter]
    fn underlying_store(&self, py: Python<'_>) -> Py<PyAny> {
        self.underlying.clone_ref(py)
    }
}

/// A Python object with torch's Store methods, serving the core. Python exceptions become
/// `Error::Store` (so DistStoreError on the way back out).
struct PyObjStore {
    obj: Py<PyAny>,
}

impl PyObjStore {
    /// Runs `f` on the object with the GIL held; a Python exception becomes a Store error
    /// naming the operation and its key(s).
    fn call<T>(
        &self,
        op: &str,
        keys: &dyn std::fmt::Debug,
        f: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> PyResult<T>,
    ) -> rustdist_core::Result<T> {
        Python::attach(|py| {
            f(py, self.obj.bind(py))
                .map_err(|e| interrupt::from_py(py, e, |e| format!("{op} {keys:?} failed: {e}")))
        })
    }

    /// torch's `get`/`multi_get` take no timeout: an explicit one is honoured by a `wait`
    /// first.
    fn wait_first(
        &self,
        py: Python<'_>,
        o: &Bound<'_, PyAny>,
        keys: &[String],
        timeout: Option<Duration>,
    ) -> PyResult<()> {
        if let Some(t) = timeout {
            o.call_method1("wait", (keys.to_vec(), duration_to_py(py, t)?))?;
        }
        Ok(())
    }
}

impl Store for PyObjStore {
    fn set(&self, key: &str, value: &[u8]) -> rustdist_core::Result<()> {
        self.call("set", &key, |py, o| {
            o.call_method1("set", (key, PyBytes::new(py, value)))
                .map(drop)
        })
    }
    fn get(&self, key: &str, timeout: Option<Duration>) -> rustdist_core::Result<Vec<u8>> {
        self.call("get", &key, |py, o| {
            self.wait_first(py, o, &[key.to_owned()], timeout)?;
            value_bytes(&o.call_method1("get", (key,))?)
        })
    }
    fn add(&self, key: &str, delta: i64) -> rustdist_core::Result<i64> {
        self.call("add", &key, |_, o| {
            o.call_method1("add", (key, delta))?.extract()
        })
    }
    fn append(&self, key: &str, value: &[u8]) -> rustdist_core::Result<()> {
        self.call("append", &key, |py, o| {
            o.call_method1("append", (key, PyBytes::new(py, value)))
                .map(drop)
        })
    }
    fn check(&self, keys: &[String]) -> rustdist_core::Result<bool> {
        self.call("check", &keys, |_, o| {
            o.call_method1("check", (keys.to_vec(),))?.extract()
        })
    }
    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> rustdist_core::Result<Vec<u8>> {
        self.call("compare_set", &key, |py, o| {
            let args = (key, PyBytes::new(py, expected), PyBytes::new(py, desired));
            value_bytes(&o.call_method1("compare_set", args)?)
        })
    }
    fn delete_key(&self, key: &str) -> rustdist_core::Result<bool> {
        self.call("delete_key", &key, |_, o| {
            o.call_method1("delete_key", (key,))?.extract()
        })
    }
    fn multi_get(
        &self,
        keys: &[String],
        timeout: Option<Duration>,
    ) -> rustdist_core::Result<Vec<Vec<u8>>> {
        self.call("multi_get", &keys, |py, o| {
            self.wait_first(py, o, keys, timeout)?;
            o.call_method1("multi_get", (keys.to_vec(),))?
                .try_iter()?
                .map(|v| value_bytes(&v?))
                .collect()
        })
    }
    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> rustdist_core::Result<()> {
        self.call("multi_set", &keys, |py, o| {
            let values: Vec<_> = values.iter().map(|v| PyBytes::new(py, v)).collect();
            o.call_method1("multi_set", (keys.to_vec(), values))
                .map(drop)
        })
    }
    fn num_keys(&self) -> rustdist_core::Result<i64> {
        self.call("num_keys", &(), |_, o| {
            o.call_method0("num_keys")?.extract()
        })
    }
    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> rustdist_core::Result<()> {
        self.call("wait", &keys, |py, o| match timeout {
            Some(t) => o
                .call_method1("wait", (keys.to_vec(), duration_to_py(py, t)?))
                .map(drop),
            None => o.call_method1("wait", (keys.to_vec(),)).map(drop),
        })
    }
    fn timeout(&self) -> Duration {
        self.call("timeout", &(), |_, o| {
            duration_from_py(&o.getattr("timeout")?)
        })
        .unwrap_or(DEFAULT_TIMEOUT)
    }
    fn set_timeout(&self, timeout: Duration) {
        // The trait cannot report failure here; a store without set_timeout keeps its own.
        let _ = self.call("set_timeout", &(), |py, o| {
            o.call_method1("set_timeout", (duration_to_py(py, timeout)?,))
                .map(drop)
        });
    }
}

/// The core store behind `obj`: a rustdist store's own, or an adapter calling `obj`'s methods.
pub fn store_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Arc<dyn Store>> {
    if let Ok(store) = obj.cast::<PyStore>() {
        return Ok(Arc::clone(&store.get().inner));
    }
    for method in ["set", "get", "add", "check", "wait"] {
        if !obj.hasattr(method)? {
            return Err(PyTypeError::new_err(format!(
                "not a store: {} has no method {method}()",
                obj.get_type().name()?
            )));
        }
    }
    Ok(Arc::new(PyObjStore {
        obj: obj.clone().unbind(),
    }))
}

/// Where the core's `log` records go: stderr, like torch's C++ warnings, at the level
/// `RUSTDIST_LOG_LEVEL` names (error, warn (default), info, debug, trace, off). The store server
/// and the peer handshake log the connections they refuse.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!("[rustdist {}] {}", record.level(), record.args());
        }
    }
    fn flush(&self) {}
}

fn install_logger() {
    let level = std::env::var("RUSTDIST_LOG_LEVEL")
        .ok()
        .and_then(|v| v.parse::<log::LevelFilter>().ok())
        .unwrap_or(log::LevelFilter::Warn);
    // Fails only when a logger is already installed, which then stays.
    if log::set_logger(&StderrLogger).is_ok() {
        log::set_max_level(level);
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    install_logger();
    m.add_class::<PyStore>()?;
    m.add_class::<PyTcpStore>()?;
    m.add_class::<PyFileStore>()?;
    m.add_class::<PyHashStore>()?;
    m.add_class::<PyPrefixStore>()?;
    Ok(())
}
