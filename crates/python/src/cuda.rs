//! `_core.CudaGroup`, `_core.CudaWork` and the CUDA library probes.
//!
//! CUDA tensors arrive as (device pointer, element count, dtype code), the caller's current
//! stream as its raw `cudaStream_t` (an int), and a `keep` object the engine holds until the
//! GPU work has finished. Search directories are the folders of torch's nvidia wheels.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rustdist_core::cuda::{CudaGroup, CudaWork, Cudart, DevTensor, Mode, Nccl, P2pOp, SplitArgs};
use rustdist_core::group::Reduction;
use rustdist_core::work::Keepalive;
use rustdist_core::{CollectiveKind, DType, ReduceOp};

use crate::error::{CoreResult, PyDistError};
use crate::flight;
use crate::group::{ExchangeBlocks, PyProcessGroup};
use crate::store::store_from_py;
use crate::work::PyWork;

fn dev(ptr: usize, numel: usize, dtype: u8) -> CoreResult<DevTensor> {
    Ok(DevTensor {
        ptr,
        dtype: DType::from_code(dtype)?,
        numel,
    })
}

fn keepalive(keep: Py<PyAny>) -> Option<Keepalive> {
    Some(Box::new(keep))
}

fn reduction(op: u8, premul: Option<f64>) -> CoreResult<Reduction> {
    Ok(Reduction::new(ReduceOp::from_code(op)?, premul)?)
}

/// The (major, minor, patch) of the NCCL found in `search_dirs` (then
/// `RUSTDIST_NCCL_LIBRARY`, then the system); RuntimeError saying why when none loads.
#[pyfunction]
fn cuda_nccl_version(py: Python<'_>, search_dirs: Vec<PathBuf>) -> PyResult<(u32, u32, u32)> {
    py.detach(|| Nccl::global(&search_dirs).map(|n| n.loaded().version))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// A fresh ncclUniqueId (128 bytes; NCCL opens its bootstrap listener, no GPU needed).
#[pyfunction]
fn cuda_nccl_unique_id<'py>(
    py: Python<'py>,
    search_dirs: Vec<PathBuf>,
) -> PyResult<Bound<'py, PyBytes>> {
    let id = py
        .detach(|| {
            let nccl = Nccl::global(&search_dirs).map_err(|e| e.to_string())?;
            nccl.unique_id().map_err(|e| e.to_string())
        })
        .map_err(PyRuntimeError::new_err)?;
    Ok(PyBytes::new(py, &id.to_bytes()))
}

/// True when the CUDA runtime loads and sees at least one device.
#[pyfunction]
fn cuda_is_available(py: Python<'_>, search_dirs: Vec<PathBuf>) -> bool {
    py.detach(|| Cudart::global(&search_dirs).and_then(|rt| rt.device_count()))
        .is_ok_and(|n| n > 0)
}

/// What loads from `search_dirs`: {"nccl": {"path", "version"} or {"error"}, "cudart": the
/// same, "driver_version": (major, minor, patch) or None, "device_count": int or an error
/// string}.
#[pyfunction]
#[pyo3(signature = (search_dirs = Vec::new()))]
fn cuda_load_report(py: Python<'_>, search_dirs: Vec<PathBuf>) -> PyResult<Bound<'_, PyDict>> {
    let (nccl, rt) = py.detach(|| (Nccl::global(&search_dirs), Cudart::global(&search_dirs)));
    let entry =
        |loaded: Result<&rustdist_core::cuda::Loaded, String>| -> PyResult<Bound<'_, PyDict>> {
            let d = PyDict::new(py);
            match loaded {
                Ok(l) => {
                    d.set_item("path", l.path.to_string_lossy())?;
                    d.set_item("version", l.version)?;
                }
                Err(e) => d.set_item("error", e)?,
            }
            Ok(d)
        };
    let report = PyDict::new(py);
    report.set_item(
        "nccl",
        entry(nccl.as_ref().map(|n| n.loaded()).map_err(|e| e.to_string()))?,
    )?;
    report.set_item(
        "cudart",
        entry(rt.as_ref().map(|rt| rt.loaded()).map_err(|e| e.to_string()))?,
    )?;
    match rt {
        Ok(rt) => {
            report.set_item("driver_version", rt.driver_version().ok())?;
            match rt.device_count() {
                Ok(n) => report.set_item("device_count", n)?,
                Err(e) => report.set_item("device_count", e.to_string())?,
            }
        }
        Err(_) => {
            report.set_item("driver_version", py.None())?;
            report.set_item("device_count", "the CUDA runtime is not loaded")?;
        }
    }
    Ok(report)
}

/// A member's arguments to `CudaGroup.split`: (pg, store, rank, size, timeout, group_name).
type SplitMember<'py> = (
    Bound<'py, PyProcessGroup>,
    Bound<'py, PyAny>,
    usize,
    usize,
    f64,
    String,
);

/// The handle of a CUDA operation (torch's WorkNCCL).
#[pyclass(module = "rustdist._core", name = "CudaWork", frozen)]
pub struct PyCudaWork {
    work: CudaWork,
    /// The engine Work (completes when the GPU work does), for what `_core.Work` offers.
    inner: Py<PyWork>,
}

impl PyCudaWork {
    fn new(py: Python<'_>, work: CudaWork) -> PyResult<PyCudaWork> {
        let inner = Py::new(py, PyWork::from(work.work().clone()))?;
        Ok(PyCudaWork { work, inner })
    }
}

#[pymethods]
impl PyCudaWork {
    /// Makes `stream` (a raw cudaStream_t) wait on the device for the operation's end; raises
    /// the operation's error if it has already failed. Does not block the host.
    fn wait(&self, py: Python<'_>, stream: usize) -> PyResult<bool> {
        py.detach(|| self.work.wait_stream(stream))
            .map_err(PyDistError)?;
        Ok(true)
    }

    /// Blocks (GIL released) until the operation has finished on the device.
    #[pyo3(signature = (timeout = None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = timeout.map(Duration::from_secs_f64);
        py.detach(|| self.work.synchronize(timeout))
            .map_err(PyDistError)?;
        Ok(true)
    }

    fn is_completed(&self) -> bool {
        self.work.is_completed()
    }

    fn is_success(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner.call_method0(py, "is_success")?.extract(py)
    }

    fn exception(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.inner.call_method0(py, "exception")
    }

    fn source_rank(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.inner.call_method0(py, "source_rank")
    }

    /// Calls `fn(None)` or `fn(error)` once the GPU work has finished.
    fn add_done_callback(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        self.inner
            .call_method1(py, "add_done_callback", (callback,))
            .map(drop)
    }

    /// The `_core.Work` that completes when the GPU work does.
    #[getter]
    fn work(&self, py: Python<'_>) -> Py<PyWork> {
        self.inner.clone_ref(py)
    }
}

/// The CUDA side of a process group on one device (NCCL, or staged through host memory).
#[pyclass(module = "rustdist._core", name = "CudaGroup", frozen)]
pub struct PyCudaGroup {
    group: CudaGroup,
}

impl PyCudaGroup {
    fn done(&self, py: Python<'_>, work: rustdist_core::Result<CudaWork>) -> PyResult<PyCudaWork> {
        PyCudaWork::new(py, work.map_err(PyDistError)?)
    }
}

#[pymethods]
impl PyCudaGroup {
    /// Collective over the group's ranks. `pg` runs the host-staged steps and must be used by
    /// nothing else; `store` carries the device exchange and NCCL's unique id.
    #[new]
    #[pyo3(signature = (pg, store, rank, size, timeout, group_name, device, search_dirs = Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pg: &Bound<'_, PyProcessGroup>,
        store: &Bound<'_, PyAny>,
        rank: usize,
        size: usize,
        timeout: f64,
        group_name: String,
        device: i32,
        search_dirs: Vec<PathBuf>,
    ) -> PyResult<Self> {
        let cpu = pg.get().core();
        let store = store_from_py(store)?;
        let timeout = Duration::from_secs_f64(timeout);
        let group = py
            .detach(|| {
                // Load from torch's wheels first, so that CudaGroup::new finds those (it uses
                // the libraries already loaded). NCCL's error, if it is needed, comes from there.
                let _ = Nccl::global(&search_dirs);
                let _ = Cudart::global(&search_dirs);
                CudaGroup::new(cpu, store, rank, size, &group_name, timeout, device)
            })
            .map_err(PyDistError)?;
        Ok(PyCudaGroup { group })
    }

    /// "nccl", or "staged" (ranks share a GPU: everything goes through host memory).
    #[getter]
    fn mode(&self) -> &'static str {
        match self.group.mode() {
            Mode::Nccl => "nccl",
            Mode::Staged => "staged",
        }
    }

    #[getter]
    fn device(&self) -> i32 {
        self.group.device()
    }

    #[getter]
    fn rank(&self) -> usize {
        self.group.rank()
    }

    #[getter]
    fn size(&self) -> usize {
        self.group.size()
    }

    #[getter]
    fn timeout(&self) -> f64 {
        self.group.timeout().as_secs_f64()
    }

    /// Sets the timeout (seconds) of the CUDA operations issued after this call (and of the
    /// staging group's); those issued before keep theirs. ValueError for a negative or NaN.
    fn set_timeout(&self, timeout: f64) -> PyResult<()> {
        self.group
            .set_timeout(crate::group::timeout_from_secs(timeout)?);
        Ok(())
    }

    #[pyo3(signature = (ptr, numel, dtype, op, stream, keep, premul = None))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        op: u8,
        stream: usize,
        keep: Py<PyAny>,
        premul: Option<f64>,
    ) -> PyResult<PyCudaWork> {
        let t = dev(ptr, numel, dtype)?;
        let red = reduction(op, premul)?;
        flight::note_stack(py);
        let w = py.detach(|| self.group.all_reduce(t, red, stream, keepalive(keep)));
        self.done(py, w)
    }

    #[pyo3(signature = (ptr, numel, dtype, op, root, stream, keep, premul = None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        op: u8,
        root: usize,
        stream: usize,
        keep: Py<PyAny>,
        premul: Option<f64>,
    ) -> PyResult<PyCudaWork> {
        let t = dev(ptr, numel, dtype)?;
        let red = reduction(op, premul)?;
        flight::note_stack(py);
        let w = py.detach(|| self.group.reduce(t, root, red, stream, keepalive(keep)));
        self.done(py, w)
    }

    #[allow(clippy::too_many_arguments)]
    fn broadcast(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        root: usize,
        stream: usize,
        keep: Py<PyAny>,
    ) -> PyResult<PyCudaWork> {
        let t = dev(ptr, numel, dtype)?;
        flight::note_stack(py);
        let w = py.detach(|| self.group.broadcast(t, root, stream, keepalive(keep)));
        self.done(py, w)
    }

    /// `outputs[r] = (pointer, numel)` receives rank r's input (sizes may differ by rank).
    #[allow(clippy::too_many_arguments)]
    fn all_gather(
        &self,
        py: Python<'_>,
        in_ptr: usize,
        numel: usize,
        dtype: u8,
        outputs: Vec<(usize, usize)>,
        stream: usize,
        keep: Py<PyAny>,
    ) -> PyResult<PyCudaWork> {
        let input = dev(in_ptr, numel, dtype)?;
        let outputs = outputs
            .into_iter()
            .map(|(p, n)| dev(p, n, dtype))
            .collect::<CoreResult<Vec<_>>>()?;
        flight::note_stack(py);
        let w = py.detach(|| {
            self.group
                .all_gather(input, outputs, stream, keepalive(keep))
        });
        self.done(py, w)
    }

    /// all_gather_into_tensor: the output holds size × `numel` elements.
    #[allow(clippy::too_many_arguments)]
    fn all_gather_into(
        &self,
        py: Python<'_>,
        in_ptr: usize,
        out_ptr: usize,
        numel: usize,
        dtype: u8,
        stream: usize,
        keep: Py<PyAny>,
    ) -> PyResult<PyCudaWork> {
        let input = dev(in_ptr, numel, dtype)?;
        let output = dev(out_ptr, numel * self.group.size(), dtype)?;
        flight::note_stack(py);
        let w = py.detach(|| {
            self.group
                .all_gather_into(input, output, stream, keepalive(keep))
        });
        self.done(py, w)
    }

    /// reduce_scatter with a list: `in_ptrs[r]` (numel elements each) reduces into rank r's
    /// output.
    #[pyo3(signature = (in_ptrs, out_ptr, numel, dtype, op, stream, keep, premul = None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        in_ptrs: Vec<usize>,
        out_ptr: usize,
        numel: usize,
        dtype: u8,
        op: u8,
        stream: usize,
        keep: Py<PyAny>,
        premul: Option<f64>,
    ) -> PyResult<PyCudaWork> {
        let inputs = in_ptrs
            .into_iter()
            .map(|p| dev(p, numel, dtype))
            .collect::<CoreResult<Vec<_>>>()?;
        let output = dev(out_ptr, numel, dtype)?;
        let red = reduction(op, premul)?;
        flight::note_stack(py);
        let w = py.detach(|| {
            self.group
                .reduce_scatter(inputs, output, red, stream, keepalive(keep))
        });
        self.done(py, w)
    }

    /// reduce_scatter_tensor: the input holds size × `numel` elements, the output `numel`.
    #[pyo3(signature = (in_ptr, out_ptr, numel, dtype, op, stream, keep, premul = None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_tensor(
        &self,
        py: Python<'_>,
        in_ptr: usize,
        out_ptr: usize,
        numel: usize,
        dtype: u8,
        op: u8,
        stream: usize,
        keep: Py<PyAny>,
        premul: Option<f64>,
    ) -> PyResult<PyCudaWork> {
        let input = dev(in_ptr, numel * self.group.size(), dtype)?;
        let output = dev(out_ptr, numel, dtype)?;
        let red = reduction(op, premul)?;
        flight::note_stack(py);
        let w = py.detach(|| {
            self.group
                .reduce_scatter_tensor(input, output, red, stream, keepalive(keep))
        });
        self.done(py, w)
    }

    /// One step of concurrent transfers (gather, scatter, all_to_all): `sends`/`recvs` are
    /// (peer, pointer, numel), or one buffer's base with `count` elements per rank; `kind` is
    /// the collective's torch name, `count` what all ranks agree on (or 0).
    #[allow(clippy::too_many_arguments)]
    fn exchange(
        &self,
        py: Python<'_>,
        kind: &str,
        dtype: u8,
        count: u64,
        sends: ExchangeBlocks,
        recvs: ExchangeBlocks,
        stream: usize,
        keep: Py<PyAny>,
    ) -> PyResult<PyCudaWork> {
        let kind = CollectiveKind::from_name(kind).map_err(PyDistError)?;
        let size = self.group.size();
        let blocks = |list: ExchangeBlocks| -> CoreResult<Vec<(usize, DevTensor)>> {
            list.listed(count, dtype, size)?
                .into_iter()
                .map(|(peer, p, n)| Ok((peer, dev(p, n, dtype)?)))
                .collect()
        };
        let (sends, recvs) = (blocks(sends)?, blocks(recvs)?);
        let dtype = DType::from_code(dtype).map_err(PyDistError)?;
        flight::note_stack(py);
        let w = py.detach(|| {
            self.group
                .exchange(kind, dtype, count, sends, recvs, stream, keepalive(keep))
        });
        self.done(py, w)
    }

    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        dst: usize,
        tag: i64,
        stream: usize,
        keep: Py<PyAny>,
    ) -> PyResult<PyCudaWork> {
        let t = dev(ptr, numel, dtype)?;
        flight::note_stack(py);
        let w = py.detach(|| self.group.send(t, dst, tag, stream, keepalive(keep)));
        self.done(py, w)
    }

    #[pyo3(signature = (ptr, numel, dtype, src, tag, stream, keep))]
    #[allow(clippy::too_many_arguments)]
    fn recv(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        src: Option<usize>,
        tag: i64,
        stream: usize,
        keep: Py<PyAny>,
    ) -> PyResult<PyCudaWork> {
        let t = dev(ptr, numel, dtype)?;
        flight::note_stack(py);
        let w = py.detach(|| self.group.recv(t, src, tag, stream, keepalive(keep)));
        self.done(py, w)
    }

    /// batch_isend_irecv: `ops` are (is_send, peer, pointer, numel, dtype, tag).
    fn batch_isend_irecv(
        &self,
        py: Python<'_>,
        ops: Vec<(bool, usize, usize, usize, u8, i64)>,
        stream: usize,
        keep: Py<PyAny>,
    ) -> PyResult<PyCudaWork> {
        let ops = ops
            .into_iter()
            .map(|(send, peer, p, n, dtype, tag)| {
                Ok(P2pOp {
                    send,
                    peer,
                    tensor: dev(p, n, dtype)?,
                    tag,
                })
            })
            .collect::<CoreResult<Vec<_>>>()?;
        flight::note_stack(py);
        let w = py.detach(|| {
            self.group
                .batch_isend_irecv(ops, stream, keepalive(keep))
                .map(|(w, _)| w)
        });
        self.done(py, w)
    }

    /// A barrier on the device (wait with `synchronize()`, as torch's barrier blocks the host).
    fn barrier(&self, py: Python<'_>, stream: usize) -> PyResult<PyCudaWork> {
        flight::note_stack(py);
        let w = py.detach(|| self.group.barrier(stream));
        self.done(py, w)
    }

    /// A subgroup. `member` is (pg, store, rank, size, timeout, group_name) on the subgroup's
    /// members, None on the other ranks. Collective over every rank of this group when it has
    /// NCCL (ncclCommSplit), else over the members only. Returns None on non-members.
    fn split(
        &self,
        py: Python<'_>,
        member: Option<SplitMember<'_>>,
    ) -> PyResult<Option<PyCudaGroup>> {
        let member = match member {
            Some((pg, store, rank, size, timeout, name)) => Some(SplitArgs {
                cpu: pg.get().core(),
                store: store_from_py(&store)?,
                rank,
                size,
                name,
                timeout: Duration::from_secs_f64(timeout),
            }),
            None => None,
        };
        let child = py
            .detach(|| self.group.split(member))
            .map_err(PyDistError)?;
        Ok(child.map(|group| PyCudaGroup { group }))
    }

    /// Names the group in its flight recorder as torch knows it (see the CPU group's).
    fn set_trace_info(&self, name: &str, desc: &str, ranks: Vec<usize>) {
        self.group.set_trace_info(name, desc, ranks);
    }

    /// Whether `shrink` can run: a staged group, or NCCL with ncclCommShrink (>= 2.27).
    #[getter]
    fn can_shrink(&self) -> bool {
        self.group.can_shrink()
    }

    /// The group of this one's ranks but `excluded` (sorted), renumbered in order, named
    /// `name`: ncclCommShrink, and the staging group's shrink. `abort_pending` aborts pending
    /// operations first. The remaining ranks call it; this group is aborted afterwards.
    fn shrink(
        &self,
        py: Python<'_>,
        excluded: Vec<usize>,
        abort_pending: bool,
        name: String,
    ) -> PyResult<PyCudaGroup> {
        let group = py
            .detach(|| self.group.shrink(&excluded, abort_pending, &name))
            .map_err(PyDistError)?;
        Ok(PyCudaGroup { group })
    }

    /// Leaves cleanly: pending work finishes (bounded by the timeout), then the communicator
    /// is finalized and destroyed. Blocks with the GIL released.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.group.shutdown());
    }

    /// Aborts the communicator; pending and later operations fail with DistBackendError.
    fn abort(&self, py: Python<'_>) {
        py.detach(|| self.group.abort());
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cuda_nccl_version, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_nccl_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_is_available, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_load_report, m)?)?;
    m.add_class::<PyCudaGroup>()?;
    m.add_class::<PyCudaWork>()?;
    Ok(())
}
