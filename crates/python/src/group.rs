//! `_core.ProcessGroup`: tensors arrive as (pointer, element count, dtype code) plus a `keep`
//! object the engine holds until the Work completes; nothing is copied here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use rustdist_core::algorithms::{select, AlgoOverrides, Measured};
use rustdist_core::group::{Blocks, Reduction, Run};
use rustdist_core::tensor::{RawBuf, Tensor};
use rustdist_core::work::Keepalive;
use rustdist_core::{CollectiveKind, DType, ProcessGroup, ReduceOp};

use crate::error::{CoreResult, PyDistError};
use crate::flight;
use crate::interrupt;
use crate::store::store_from_py;
use crate::work::PyWork;

#[pyclass(module = "rustdist._core", name = "ProcessGroup", frozen, subclass)]
pub struct PyProcessGroup {
    pg: Arc<ProcessGroup>,
    /// Whether collective hooks are registered on the group: the fast path then hands its
    /// calls to Python, which fires them.
    hooked: AtomicBool,
}

impl PyProcessGroup {
    fn wrap(pg: ProcessGroup) -> Self {
        PyProcessGroup {
            pg: Arc::new(pg),
            hooked: AtomicBool::new(false),
        }
    }

    /// The engine group (the CUDA group stages its host steps on one).
    pub(crate) fn core(&self) -> Arc<ProcessGroup> {
        self.pg.clone()
    }

    /// Whether collective hooks are registered (the fast path leaves such groups to Python).
    pub(crate) fn hooked(&self) -> bool {
        self.hooked.load(Ordering::Relaxed)
    }
}

pub(crate) fn tensor(ptr: usize, numel: usize, dtype: u8) -> CoreResult<Tensor> {
    let dtype = DType::from_code(dtype)?;
    // SAFETY: the Python layer passes the data pointer of a live contiguous tensor of `numel`
    // elements of `dtype`, and hands a reference to it to the Work (`keep`) until completion.
    Ok(unsafe { Tensor::new(ptr as *mut u8, dtype, numel) })
}

fn keepalive(keep: Py<PyAny>) -> Option<Keepalive> {
    Some(Box::new(keep))
}

/// How an operation runs: synchronously (the caller holds its tensors), or with a Work that
/// holds `keep` until it completes.
pub(crate) fn how(keep: Py<PyAny>, sync: bool) -> Run {
    if sync {
        Run::Sync
    } else {
        Run::Async(keepalive(keep))
    }
}

/// A group timeout given in seconds: ValueError for a negative or NaN value; a value past
/// what a Duration holds (inf) means no timeout to speak of.
pub(crate) fn timeout_from_secs(secs: f64) -> PyResult<Duration> {
    if secs.is_nan() || secs < 0.0 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds, got {secs}"
        )));
    }
    Ok(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// How an operation without buffers runs: synchronously, or with a Work.
pub(crate) fn bufferless(sync: bool) -> Run {
    if sync {
        Run::Sync
    } else {
        Run::detached()
    }
}

/// The Work of an operation started asynchronously, None for a synchronous one.
pub(crate) fn started(work: Option<rustdist_core::Work>) -> CoreResult<Option<PyWork>> {
    Ok(work.map(PyWork::from))
}

/// The blocks of an exchange: (peer, data pointer, numel) each, or one buffer's base address
/// holding a block of `count` elements per rank in rank order.
#[derive(FromPyObject)]
pub(crate) enum ExchangeBlocks {
    Uniform(usize),
    Listed(Vec<(usize, usize, usize)>),
}

impl ExchangeBlocks {
    /// (peer, data pointer, numel) of each block; `Uniform` holds `count` elements of `dtype`
    /// for each of `size` ranks.
    pub(crate) fn listed(
        self,
        count: u64,
        dtype: u8,
        size: usize,
    ) -> CoreResult<Vec<(usize, usize, usize)>> {
        Ok(match self {
            ExchangeBlocks::Listed(list) => list,
            ExchangeBlocks::Uniform(base) => {
                let step = count as usize * DType::from_code(dtype)?.size();
                (0..size)
                    .map(|r| (r, base + r * step, count as usize))
                    .collect()
            }
        })
    }
}

/// Where all_gather writes: a pointer per rank, or one buffer's base address.
#[derive(FromPyObject)]
pub(crate) enum GatherOutputs {
    Contiguous(usize),
    Blocks(Vec<usize>),
}

#[pymethods]
impl PyProcessGroup {
    #[new]
    fn new(
        py: Python<'_>,
        store: &Bound<'_, PyAny>,
        rank: usize,
        size: usize,
        timeout: f64,
        group_name: String,
    ) -> PyResult<Self> {
        let store = store_from_py(store)?;
        let timeout = Duration::from_secs_f64(timeout);
        let pg = interrupt::blocking(py, || {
            ProcessGroup::new(store, rank, size, &group_name, timeout)
        })
        .map_err(PyDistError)?;
        Ok(PyProcessGroup::wrap(pg))
    }

    #[getter]
    fn rank(&self) -> usize {
        self.pg.rank()
    }

    #[getter]
    pub(crate) fn size(&self) -> usize {
        self.pg.size()
    }

    #[getter]
    fn group_name(&self) -> &str {
        self.pg.name()
    }

    #[getter]
    fn timeout(&self) -> f64 {
        self.pg.timeout().as_secs_f64()
    }

    /// Sets the timeout (seconds) of the operations issued after this call; those issued
    /// before keep theirs. Raises ValueError for a negative or NaN value.
    fn set_timeout(&self, timeout: f64) -> PyResult<()> {
        self.pg.set_timeout(timeout_from_secs(timeout)?);
        Ok(())
    }

    /// How the ranks reach each other: "shm" (one host), "tcp" (no two on one host, or
    /// RUSTDIST_SHM=0) or "hierarchical" (shared memory inside hosts, TCP between them).
    #[getter]
    fn link(&self) -> &'static str {
        self.pg.link().name()
    }

    /// The TCP link model algorithm selection uses, (one-way latency in seconds, bytes per
    /// second): RUSTDIST_LINK_LATENCY_US / RUSTDIST_LINK_BANDWIDTH, else what connecting
    /// measured between hosts, else the reference loopback's.
    #[getter]
    fn link_model(&self) -> (f64, u64) {
        let model = self.pg.link_model();
        (model.latency.as_secs_f64(), model.bandwidth)
    }

    /// Whether the group can hold one-sided windows: always (UNIFIED or SEPARATE access).
    #[getter]
    fn supports_window(&self) -> bool {
        self.pg.supports_window()
    }

    /// TCP streams joining this rank to each peer on another host (1 when none is):
    /// RUSTDIST_STREAMS_PER_PEER, else as many as keep the link's round trip in flight.
    #[getter]
    fn streams_per_peer(&self) -> usize {
        self.pg.streams_per_peer()
    }

    /// The sequence number of the last collective issued on the group (0 before any), as
    /// the flight recorder numbers them.
    #[getter]
    fn sequence_number(&self) -> u64 {
        self.pg.recorder().collective_seq()
    }

    /// The group's counters on this rank, as JSON: `ops` (by operation: `count`, `bytes`),
    /// `algorithms` (by "collective/algorithm": collectives run), `waited_s` (seconds the
    /// transport slept waiting for peers).
    fn stats(&self) -> String {
        serde_json::to_string(&self.pg.recorder().stats()).unwrap_or_else(|_| "{}".into())
    }

    /// Where this rank answers status queries ("host:port" of its heartbeats' socket); None
    /// alone in its group or with heartbeats off.
    #[getter]
    fn status_address(&self) -> Option<String> {
        self.pg.status_addr().map(|a| a.to_string())
    }

    #[pyo3(signature = (ptr, numel, dtype, op, keep, premul = None, sync = false))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_reduce(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        op: u8,
        keep: Py<PyAny>,
        premul: Option<f64>,
        sync: bool,
    ) -> CoreResult<Option<PyWork>> {
        let t = tensor(ptr, numel, dtype)?;
        let red = Reduction::new(ReduceOp::from_code(op)?, premul)?;
        let (pg, run) = (&self.pg, how(keep, sync));
        flight::note_stack(py);
        started(interrupt::blocking(py, move || pg.all_reduce(t, red, run))?)
    }

    #[pyo3(signature = (ptr, numel, dtype, op, root, keep, premul = None, sync = false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        op: u8,
        root: usize,
        keep: Py<PyAny>,
        premul: Option<f64>,
        sync: bool,
    ) -> CoreResult<Option<PyWork>> {
        let t = tensor(ptr, numel, dtype)?;
        let red = Reduction::new(ReduceOp::from_code(op)?, premul)?;
        let (pg, run) = (&self.pg, how(keep, sync));
        flight::note_stack(py);
        started(interrupt::blocking(py, move || {
            pg.reduce(t, root, red, run)
        })?)
    }

    /// gather, scatter, all_to_all or all_gather of blocks of different sizes (`kind`, the
    /// torch name): `sends`/`recvs` are (peer, data pointer, numel) by peer; `count` is what
    /// all ranks agree on (or 0).
    #[pyo3(signature = (kind, dtype, count, sends, recvs, keep, sync = false))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exchange(
        &self,
        py: Python<'_>,
        kind: &str,
        dtype: u8,
        count: u64,
        sends: ExchangeBlocks,
        recvs: ExchangeBlocks,
        keep: Py<PyAny>,
        sync: bool,
    ) -> CoreResult<Option<PyWork>> {
        let kind = CollectiveKind::from_name(kind)?;
        let size = self.pg.size();
        let block = |(peer, ptr, numel): (usize, usize, usize)| -> CoreResult<(usize, RawBuf)> {
            Ok((peer, tensor(ptr, numel, dtype)?.buf))
        };
        let list = |blocks: ExchangeBlocks| -> CoreResult<Vec<(usize, RawBuf)>> {
            blocks
                .listed(count, dtype, size)?
                .into_iter()
                .map(block)
                .collect()
        };
        let blocks = Blocks {
            sends: list(sends)?,
            recvs: list(recvs)?,
        };
        let dtype = DType::from_code(dtype)?;
        let (pg, run) = (&self.pg, how(keep, sync));
        flight::note_stack(py);
        started(interrupt::blocking(py, move || {
            pg.exchange(kind, dtype, count, blocks, run)
        })?)
    }

    /// torch's monitored_barrier (timeout in seconds).
    fn monitored_barrier(&self, timeout: f64, wait_all_ranks: bool) -> CoreResult<PyWork> {
        let timeout = Duration::from_secs_f64(timeout);
        Ok(self.pg.monitored_barrier(timeout, wait_all_ranks)?.into())
    }

    #[pyo3(signature = (ptr, numel, dtype, root, keep, sync = false))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn broadcast(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        root: usize,
        keep: Py<PyAny>,
        sync: bool,
    ) -> CoreResult<Option<PyWork>> {
        let t = tensor(ptr, numel, dtype)?;
        let (pg, run) = (&self.pg, how(keep, sync));
        flight::note_stack(py);
        started(interrupt::blocking(py, move || pg.broadcast(t, root, run))?)
    }

    /// `outputs`: one data pointer per rank, or the base of one buffer holding every rank's
    /// block in rank order (all_gather_into_tensor).
    #[pyo3(signature = (in_ptr, outputs, numel, dtype, keep, sync = false))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_gather(
        &self,
        py: Python<'_>,
        in_ptr: usize,
        outputs: GatherOutputs,
        numel: usize,
        dtype: u8,
        keep: Py<PyAny>,
        sync: bool,
    ) -> CoreResult<Option<PyWork>> {
        let input = tensor(in_ptr, numel, dtype)?;
        let ptrs = match outputs {
            GatherOutputs::Blocks(ptrs) => ptrs,
            GatherOutputs::Contiguous(base) => {
                let step = input.nbytes();
                (0..self.pg.size()).map(|r| base + r * step).collect()
            }
        };
        let outputs: Vec<RawBuf> = ptrs
            .into_iter()
            .map(|p| tensor(p, numel, dtype).map(|t| t.buf))
            .collect::<CoreResult<_>>()?;
        let (pg, run) = (&self.pg, how(keep, sync));
        flight::note_stack(py);
        started(interrupt::blocking(py, move || {
            pg.all_gather(input, outputs, run)
        })?)
    }

    #[pyo3(signature = (in_ptr, out_ptr, numel, dtype, op, keep, premul = None, sync = false))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce_scatter(
        &self,
        py: Python<'_>,
        in_ptr: usize,
        out_ptr: usize,
        numel: usize,
        dtype: u8,
        op: u8,
        keep: Py<PyAny>,
        premul: Option<f64>,
        sync: bool,
    ) -> CoreResult<Option<PyWork>> {
        let input = tensor(in_ptr, numel * self.pg.size(), dtype)?;
        let output = tensor(out_ptr, numel, dtype)?;
        let red = Reduction::new(ReduceOp::from_code(op)?, premul)?;
        let (pg, run) = (&self.pg, how(keep, sync));
        flight::note_stack(py);
        started(interrupt::blocking(py, move || {
            pg.reduce_scatter(input, output, red, run)
        })?)
    }

    #[pyo3(signature = (sync = false))]
    pub(crate) fn barrier(&self, py: Python<'_>, sync: bool) -> CoreResult<Option<PyWork>> {
        let pg = &self.pg;
        let run = bufferless(sync);
        flight::note_stack(py);
        started(interrupt::blocking(py, move || pg.barrier(run))?)
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
        keep: Py<PyAny>,
    ) -> CoreResult<PyWork> {
        let t = tensor(ptr, numel, dtype)?;
        flight::note_stack(py);
        Ok(self.pg.send(t, dst, tag, keepalive(keep))?.into())
    }

    #[pyo3(signature = (ptr, numel, dtype, src, tag, keep))]
    #[allow(clippy::too_many_arguments)]
    fn recv(
        &self,
        py: Python<'_>,
        ptr: usize,
        numel: usize,
        dtype: u8,
        src: Option<usize>,
        tag: i64,
        keep: Py<PyAny>,
    ) -> CoreResult<PyWork> {
        let t = tensor(ptr, numel, dtype)?;
        flight::note_stack(py);
        Ok(self.pg.recv(t, src, tag, keepalive(keep))?.into())
    }

    /// Leaves the group cleanly: queued work still runs, then peers are told. Blocks (GIL
    /// released: completions may call back into Python) until the worker has finished.
    fn shutdown(&self, py: Python<'_>) {
        let pg = self.pg.clone();
        py.detach(|| pg.shutdown());
    }

    /// Fails queued work and tells peers the group is aborted.
    fn abort(&self) {
        self.pg.abort();
    }

    /// The group of this one's ranks but `excluded` (sorted group ranks, without this one),
    /// renumbered in order, over the same links; every other rank calls it too.
    /// `abort_pending` aborts this group's pending operations first, else they are an error
    /// (unless the group has failed). This group refuses work afterwards.
    fn shrink(&self, py: Python<'_>, excluded: Vec<usize>, abort_pending: bool) -> PyResult<Self> {
        let pg = self.pg.clone();
        let shrunk =
            interrupt::blocking(py, || pg.shrink(&excluded, abort_pending)).map_err(PyDistError)?;
        Ok(PyProcessGroup::wrap(shrunk))
    }

    /// Deletes from `store` (the group's) the keys this rank published while connecting,
    /// after a barrier (GIL released). Collective.
    fn forget_rendezvous(&self, py: Python<'_>, store: &Bound<'_, PyAny>) -> PyResult<()> {
        let store = store_from_py(store)?;
        let pg = self.pg.clone();
        interrupt::blocking(py, || pg.forget_rendezvous(&*store)).map_err(PyDistError)?;
        Ok(())
    }

    /// Leaves a group a reconfigure replaced: pending and later operations fail with
    /// `reason`; returns once its worker has finished (GIL released).
    fn retire(&self, py: Python<'_>, reason: &str) {
        let pg = self.pg.clone();
        py.detach(|| pg.retire(reason));
    }

    /// Waits up to `timeout` seconds (GIL released) for the group to fail: the error that
    /// failed it, else None (abort hooks wait so).
    fn wait_failed(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<PyErr>> {
        let timeout = timeout_from_secs(timeout)?;
        let pg = self.pg.clone();
        let failed = py.detach(|| pg.wait_failed(timeout));
        Ok(failed.map(|e| PyDistError(e).into()))
    }

    /// Whether collective hooks are registered on the group (set by the Python side; the
    /// fast path hands a hooked group's calls to Python, which fires them).
    #[getter(hooked)]
    fn is_hooked(&self) -> bool {
        self.hooked()
    }

    fn set_hooked(&self, hooked: bool) {
        self.hooked.store(hooked, Ordering::Relaxed);
    }

    /// The error that failed the group (an operation's, an abort, a dead peer), or None.
    fn error(&self) -> Option<PyErr> {
        self.pg.error().map(|e| PyDistError(e).into())
    }

    /// Names the group in its flight recorder as torch knows it: `name` (torch's
    /// `group_name`), `desc` (`group_desc`), the members' global ranks by group rank.
    fn set_trace_info(&self, name: &str, desc: &str, ranks: Vec<usize>) {
        self.pg.recorder().set_info(name, desc, ranks);
    }
}

/// A row of the selection table: (collective, link kind, world, bytes, algorithm).
type Choice = (&'static str, &'static str, usize, usize, &'static str);

/// The algorithm the engine picks per (collective, link kind, world size, bytes), with
/// `RUSTDIST_ALGO` applied, for ranks on this machine's cores.
#[pyfunction]
pub fn selection_table(worlds: Vec<usize>, sizes: Vec<usize>) -> CoreResult<Vec<Choice>> {
    let overrides = AlgoOverrides::from_env(Measured::default())?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(select::table(&overrides, &worlds, &sizes, cores)
        .into_iter()
        .map(|c| (c.collective, c.link.name(), c.world, c.bytes, c.algorithm))
        .collect())
}
