//! `CudaGroup`: the CUDA operations of one process group on one device (see the module docs
//! for what runs on NCCL and what is staged through host memory). Each operation validates its
//! arguments, routes itself (NCCL or host-staged), builds its plan from [`super::nccl_calls`]
//! or [`super::staged`] and submits it to the engine ([`super::engine`]). The point-to-point
//! operations are in [`super::p2p`].

use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustdist_nccl_sys::{Cudart, Nccl, NcclDataType, NcclRedOp, NcclUniqueId};

use super::codes::{self, OpSpec, Route, BYTES};
use super::comm::Comm;
use super::engine::{lock, Inner, NcclBody, Plan};
use super::nccl_calls;
use super::rt::DeviceGuard;
use super::staged::{
    staged_all_gather, staged_all_reduce, staged_barrier, staged_broadcast, staged_exchange,
    staged_reduce, staged_reduce_scatter, Staged,
};
use super::types::{DevTensor, Mode};
use super::work::CudaWork;
use crate::error::{Error, Result};
use crate::group::{ProcessGroup, Reduction};
use crate::recorder::Op;
use crate::store::Store;
use crate::types::{CollectiveKind, DType};
use crate::work::Keepalive;

/// A member's side of [`CudaGroup::split`]: what [`CudaGroup::new`] takes for the subgroup.
pub struct SplitArgs {
    pub cpu: Arc<ProcessGroup>,
    pub store: Arc<dyn Store>,
    pub rank: usize,
    pub size: usize,
    pub name: String,
    pub timeout: Duration,
}

fn hostname() -> String {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer has room for the length passed; the last byte stays NUL.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr(), buf.len() - 1) };
    if r != 0 {
        return "unknown-host".into();
    }
    // SAFETY: NUL-terminated within the buffer (its last byte is never written).
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The CUDA side of a process group on one device. Construction is collective over the
/// group's ranks; so are the operations, which every rank issues in the same order.
pub struct CudaGroup {
    pub(super) inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
}

impl CudaGroup {
    /// Joins the CUDA group `name` of `size` ranks on `device`: ranks exchange their GPU's
    /// identity (host and PCI bus id) through `store`; distinct GPUs get an NCCL communicator
    /// (rank 0's unique id through the store, a non-blocking init bounded by `timeout`), a GPU
    /// shared by several ranks makes every operation staged. `cpu` runs the staged steps; the
    /// CUDA group owns it (shuts it down or aborts it with itself) and nothing else may use it:
    /// its operations are issued from this group's helper thread, and another thread's could
    /// interleave differently on each rank.
    /// The CUDA runtime and NCCL are those already loaded ([`Cudart::global`],
    /// [`Nccl::global`]), else found on the system.
    pub fn new(
        cpu: Arc<ProcessGroup>,
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        name: &str,
        timeout: Duration,
        device: i32,
    ) -> Result<CudaGroup> {
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} is out of range for a group of size {size}"
            )));
        }
        let unavailable =
            |e: rustdist_nccl_sys::Error| Error::Runtime(format!("CUDA is not available: {e}"));
        let rt = Cudart::global(&[]).map_err(unavailable)?;
        let count = rt.device_count().map_err(unavailable)?;
        if count == 0 {
            return Err(Error::Runtime(
                "CUDA is not available: no CUDA device is visible".into(),
            ));
        }
        if device < 0 || device as usize >= count {
            return Err(Error::invalid(format!(
                "CUDA device {device} does not exist ({count} visible)"
            )));
        }
        let _device = DeviceGuard::set(rt, device)?;
        let me = format!("{}/{}", hostname(), rt.pci_bus_id(device)?);
        store.set(&format!("{name}/device/{rank}"), me.as_bytes())?;
        let keys: Vec<String> = (0..size).map(|r| format!("{name}/device/{r}")).collect();
        let mut gpus = store.multi_get(&keys, Some(timeout))?;
        gpus.sort();
        let shared = gpus.windows(2).any(|w| w[0] == w[1]);
        let comm = if shared {
            None
        } else {
            let nccl = Nccl::global(&[])
                .map_err(|e| Error::Runtime(format!("NCCL is not available: {e}")))?;
            let key = format!("{name}/nccl_unique_id");
            let id = if rank == 0 {
                let id = nccl.unique_id()?;
                store.set(&key, &id.to_bytes())?;
                id
            } else {
                NcclUniqueId::from_bytes(&store.get(&key, Some(timeout))?).ok_or_else(|| {
                    Error::backend(format!("{key} in the store is not an ncclUniqueId"))
                })?
            };
            Some(Comm::init(nccl, rank, size, id, timeout)?)
        };
        Self::start(cpu, rt, device, rank, size, name, timeout, comm)
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        cpu: Arc<ProcessGroup>,
        rt: &'static Cudart,
        device: i32,
        rank: usize,
        size: usize,
        name: &str,
        timeout: Duration,
        comm: Option<Comm>,
    ) -> Result<CudaGroup> {
        let (inner, threads) = Inner::start(cpu, rt, device, rank, size, name, timeout, comm)?;
        Ok(CudaGroup {
            inner,
            threads: Mutex::new(threads),
            closed: AtomicBool::new(false),
        })
    }

    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    pub fn device(&self) -> i32 {
        self.inner.device
    }

    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The timeout operations issued now get.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout.get()
    }

    /// Changes the timeout of the CUDA operations issued after this call (the watchdog's
    /// bound, from issue to completion), of the NCCL communicator's later calls, and of the
    /// staging group that runs host-staged steps. Operations issued before keep theirs.
    pub fn set_timeout(&self, timeout: Duration) {
        self.inner.timeout.set(timeout);
        if let Some(comm) = &self.inner.comm {
            comm.set_timeout(timeout);
        }
        self.inner.cpu.set_timeout(timeout);
    }

    /// Enqueues `plan` as operation `name` after the work queued so far on `stream`, recorded
    /// as a collective reading `input` and writing `output` elements of `dtype`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit(
        &self,
        name: &'static str,
        (input, output, dtype): (usize, usize, DType),
        source: Option<usize>,
        stream: usize,
        keep: Option<Keepalive>,
        plan: Plan,
    ) -> Result<CudaWork> {
        let op = Op {
            name,
            input: input as u64,
            output: output as u64,
            dtype,
            p2p: None,
            cuda: true,
        };
        self.inner.submit(name, &[op], source, stream, keep, plan)
    }

    /// Sets the group's name, description and members' global ranks, as torch knows them, for
    /// its flight recorder.
    pub fn set_trace_info(&self, name: &str, desc: &str, ranks: Vec<usize>) {
        self.inner.recorder.set_info(name, desc, ranks);
    }

    fn nccl_plan(&self, dtype: NcclDataType, op: OpSpec, body: NcclBody) -> Plan {
        Plan::Nccl { dtype, op, body }
    }

    fn data_plan(body: NcclBody) -> Plan {
        Plan::Nccl {
            dtype: BYTES,
            op: OpSpec::Builtin(NcclRedOp::SUM),
            body,
        }
    }

    pub(super) fn staged(plan: Staged) -> Plan {
        Plan::Staged(plan)
    }

    pub(super) fn check_rank(&self, what: &str, r: usize) -> Result<()> {
        if r >= self.inner.size {
            return Err(Error::invalid(format!(
                "{what} {r} is out of range for a group of size {}",
                self.inner.size
            )));
        }
        Ok(())
    }

    /// The NCCL route of a reduction, unless this group stages everything.
    fn route(&self, dtype: DType, red: &Reduction) -> Result<Route> {
        let route = codes::route(dtype, red)?;
        Ok(if self.inner.mode == Mode::Staged {
            Route::Staged
        } else {
            route
        })
    }

    /// In-place all_reduce of `t` on `stream` (torch's current stream, as a raw handle).
    pub fn all_reduce(
        &self,
        t: DevTensor,
        red: Reduction,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let plan = match self.route(t.dtype, &red)? {
            Route::Nccl(r) => self.nccl_plan(
                r.dtype,
                r.op,
                Box::new(move |nccl, comm, op, s| nccl_calls::all_reduce(nccl, comm, op, s, t, r)),
            ),
            Route::Staged => Self::staged(staged_all_reduce(self.inner.cpu.clone(), t, red)),
        };
        let n = t.numel;
        self.submit("all_reduce", (n, n, t.dtype), None, stream, keep, plan)
    }

    /// Reduces every rank's `t` into `t` on `root`; other ranks' tensors are left unchanged.
    pub fn reduce(
        &self,
        t: DevTensor,
        root: usize,
        red: Reduction,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        self.check_rank("reduce destination rank", root)?;
        let plan = match self.route(t.dtype, &red)? {
            Route::Nccl(r) => self.nccl_plan(
                r.dtype,
                r.op,
                Box::new(move |nccl, comm, op, s| {
                    nccl_calls::reduce(nccl, comm, op, s, t, r, root)
                }),
            ),
            Route::Staged => Self::staged(staged_reduce(
                self.inner.cpu.clone(),
                t,
                self.inner.rank,
                root,
                red,
            )),
        };
        self.submit(
            "reduce",
            (t.numel, t.numel, t.dtype),
            None,
            stream,
            keep,
            plan,
        )
    }

    /// Broadcast of `t` from `root` to every rank, in place.
    pub fn broadcast(
        &self,
        t: DevTensor,
        root: usize,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        self.check_rank("broadcast root", root)?;
        let plan = match self.inner.mode {
            Mode::Nccl => Self::data_plan(Box::new(move |nccl, comm, _, s| {
                nccl_calls::broadcast(nccl, comm, s, t, root)
            })),
            Mode::Staged => Self::staged(staged_broadcast(
                self.inner.cpu.clone(),
                t,
                self.inner.rank,
                root,
            )),
        };
        self.submit(
            "broadcast",
            (t.numel, t.numel, t.dtype),
            None,
            stream,
            keep,
            plan,
        )
    }

    /// Gathers every rank's `input` into `outputs[r]` on every rank; `outputs[r]` has rank
    /// r's size (they may differ: torch's uneven all_gather). NCCL: one grouped broadcast per
    /// rank.
    pub fn all_gather(
        &self,
        input: DevTensor,
        outputs: Vec<DevTensor>,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let (rank, size) = (self.inner.rank, self.inner.size);
        if outputs.len() != size {
            return Err(Error::invalid(format!(
                "all_gather needs {size} output tensors (one per rank), got {}",
                outputs.len()
            )));
        }
        if outputs.iter().any(|o| o.dtype != input.dtype) {
            return Err(Error::invalid(
                "all_gather outputs must have the input's dtype",
            ));
        }
        if outputs[rank].numel != input.numel {
            return Err(Error::invalid(format!(
                "all_gather output {rank} has {} elements but this rank's input has {}",
                outputs[rank].numel, input.numel
            )));
        }
        let total: usize = outputs.iter().map(|o| o.numel).sum();
        // Blocks of different sizes: the analyzer compares inputs across ranks, so each
        // records the whole result as both (as the CPU engine does).
        let (name, recorded) = if outputs.iter().all(|o| o.numel == input.numel) {
            ("all_gather", (input.numel, total, input.dtype))
        } else {
            ("all_gather_v", (total, total, input.dtype))
        };
        let plan = match self.inner.mode {
            Mode::Nccl => Self::data_plan(Box::new(move |nccl, comm, _, s| {
                nccl_calls::all_gather(nccl, comm, s, rank, input, &outputs)
            })),
            Mode::Staged => Self::staged(staged_all_gather(self.inner.cpu.clone(), input, outputs)),
        };
        self.submit(name, recorded, None, stream, keep, plan)
    }

    /// torch's all_gather_into_tensor: `output` holds size × `input` (flat or stacked).
    pub fn all_gather_into(
        &self,
        input: DevTensor,
        output: DevTensor,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let size = self.inner.size;
        if output.dtype != input.dtype || output.numel != input.numel * size {
            return Err(Error::invalid(format!(
                "all_gather_into_tensor: the output must have world_size ({size}) times the \
                 input's {} elements of {}, got {} of {}",
                input.numel,
                input.dtype.name(),
                output.numel,
                output.dtype.name()
            )));
        }
        let plan = match self.inner.mode {
            Mode::Nccl => Self::data_plan(Box::new(move |nccl, comm, _, s| {
                nccl_calls::all_gather_into(nccl, comm, s, input, output)
            })),
            Mode::Staged => {
                let blocks = (0..size)
                    .map(|r| output.slice(r * input.numel, input.numel))
                    .collect();
                Self::staged(staged_all_gather(self.inner.cpu.clone(), input, blocks))
            }
        };
        let recorded = (input.numel, output.numel, input.dtype);
        self.submit("all_gather", recorded, None, stream, keep, plan)
    }

    /// torch's reduce_scatter: reduces `inputs[r]` of every rank into `output` on rank r.
    /// NCCL: one grouped reduce per rank.
    pub fn reduce_scatter(
        &self,
        inputs: Vec<DevTensor>,
        output: DevTensor,
        red: Reduction,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let (rank, size) = (self.inner.rank, self.inner.size);
        if inputs.len() != size
            || inputs
                .iter()
                .any(|i| i.numel != output.numel || i.dtype != output.dtype)
        {
            return Err(Error::invalid(format!(
                "reduce_scatter needs {size} input tensors (one per rank) of the output's {} \
                 elements of {}",
                output.numel,
                output.dtype.name()
            )));
        }
        let recorded = (output.numel * size, output.numel, output.dtype);
        let plan = match self.route(output.dtype, &red)? {
            Route::Nccl(r) => self.nccl_plan(
                r.dtype,
                r.op,
                Box::new(move |nccl, comm, op, s| {
                    nccl_calls::reduce_scatter(nccl, comm, op, s, rank, &inputs, output, r)
                }),
            ),
            Route::Staged => Self::staged(staged_reduce_scatter(
                self.inner.cpu.clone(),
                inputs,
                output,
                red,
            )),
        };
        self.submit("reduce_scatter", recorded, None, stream, keep, plan)
    }

    /// torch's reduce_scatter_tensor: `input` holds size blocks of `output.numel` elements.
    pub fn reduce_scatter_tensor(
        &self,
        input: DevTensor,
        output: DevTensor,
        red: Reduction,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let size = self.inner.size;
        if input.dtype != output.dtype || input.numel != output.numel * size {
            return Err(Error::invalid(format!(
                "reduce_scatter_tensor: the input must have world_size ({size}) times the \
                 output's {} elements of {}, got {} of {}",
                output.numel,
                output.dtype.name(),
                input.numel,
                input.dtype.name()
            )));
        }
        let plan = match self.route(output.dtype, &red)? {
            Route::Nccl(r) => self.nccl_plan(
                r.dtype,
                r.op,
                Box::new(move |nccl, comm, op, s| {
                    nccl_calls::reduce_scatter_tensor(nccl, comm, op, s, input, output, r)
                }),
            ),
            Route::Staged => {
                let blocks = (0..size)
                    .map(|r| input.slice(r * output.numel, output.numel))
                    .collect();
                Self::staged(staged_reduce_scatter(
                    self.inner.cpu.clone(),
                    blocks,
                    output,
                    red,
                ))
            }
        };
        let recorded = (input.numel, output.numel, input.dtype);
        self.submit("reduce_scatter", recorded, None, stream, keep, plan)
    }

    /// One step of concurrent transfers, as the CPU group's `exchange`: `sends[i] = (peer,
    /// tensor)`, `recvs[j] = (peer, tensor)`; the k-th send to this rank fills the k-th receive
    /// from it. Serves gather, scatter and all_to_all(_single) with any split sizes (NCCL:
    /// grouped send/recv); `count` is what every rank agrees on (0 when sizes differ).
    #[allow(clippy::too_many_arguments)]
    pub fn exchange(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        count: u64,
        sends: Vec<(usize, DevTensor)>,
        recvs: Vec<(usize, DevTensor)>,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        for &(p, _) in sends.iter().chain(recvs.iter()) {
            self.check_rank(&format!("{} peer rank", kind.name()), p)?;
        }
        let elements = |list: &[(usize, DevTensor)]| list.iter().map(|(_, t)| t.numel).sum();
        let recorded = (elements(&sends), elements(&recvs), dtype);
        let plan = match self.inner.mode {
            Mode::Nccl => self.nccl_transfers(kind.name(), sends, recvs)?,
            Mode::Staged => Self::staged(staged_exchange(
                self.inner.cpu.clone(),
                kind,
                dtype,
                count,
                sends,
                recvs,
            )),
        };
        self.submit(kind.name(), recorded, None, stream, keep, plan)
    }

    /// Grouped NCCL sends and receives; transfers to this rank itself are device copies.
    pub(super) fn nccl_transfers(
        &self,
        what: &str,
        sends: Vec<(usize, DevTensor)>,
        recvs: Vec<(usize, DevTensor)>,
    ) -> Result<Plan> {
        let (rank, rt) = (self.inner.rank, self.inner.rt);
        let to_self: Vec<DevTensor> = sends
            .iter()
            .filter(|(p, _)| *p == rank)
            .map(|(_, t)| *t)
            .collect();
        let from_self: Vec<DevTensor> = recvs
            .iter()
            .filter(|(p, _)| *p == rank)
            .map(|(_, t)| *t)
            .collect();
        if to_self.len() != from_self.len()
            || to_self
                .iter()
                .zip(&from_self)
                .any(|(a, b)| a.nbytes() != b.nbytes())
        {
            return Err(Error::invalid(format!(
                "{what}: the block this rank sends to itself does not fit the block it receives from itself"
            )));
        }
        Ok(Self::data_plan(Box::new(move |nccl, comm, _, s| {
            nccl_calls::transfers(
                nccl, rt, comm, s, rank, &to_self, &from_self, &sends, &recvs,
            )
        })))
    }

    /// A barrier on the device: a one-element all_reduce (NCCL), or the CPU engine's barrier
    /// once the stream has reached it (staged). torch's barrier then blocks the host
    /// ([`CudaWork::synchronize`]).
    pub fn barrier(&self, stream: usize) -> Result<CudaWork> {
        let plan = match &self.inner.scratch {
            Some(scratch) => {
                let ptr = scratch.ptr;
                self.nccl_plan(
                    NcclDataType::FLOAT32,
                    OpSpec::Builtin(NcclRedOp::SUM),
                    Box::new(move |nccl, comm, op, s| nccl_calls::barrier(nccl, comm, op, s, ptr)),
                )
            }
            None => Self::staged(staged_barrier(self.inner.cpu.clone())),
        };
        self.submit("barrier", (0, 0, DType::U8), None, stream, None, plan)
    }

    /// A subgroup (torch's `new_group` with a bound device). Collective over *every* rank of
    /// this group when it has NCCL with ncclCommSplit (members pass `Some`, the others `None`);
    /// otherwise only members take part, with a fresh [`CudaGroup::new`] (so non-members may
    /// skip the call). Returns the member's group, `None` for the others.
    pub fn split(&self, member: Option<SplitArgs>) -> Result<Option<CudaGroup>> {
        let parent = self.inner.comm.as_ref().filter(|c| c.can_split());
        let Some(parent) = parent else {
            return member
                .map(|m| {
                    CudaGroup::new(
                        m.cpu,
                        m.store,
                        m.rank,
                        m.size,
                        &m.name,
                        m.timeout,
                        self.inner.device,
                    )
                })
                .transpose();
        };
        self.inner.check()?;
        let color = member.as_ref().map(|_| 0);
        let key = member.as_ref().map_or(0, |m| m.rank);
        let child = {
            let _device = DeviceGuard::set(self.inner.rt, self.inner.device)?;
            self.inner.exclusive(|| parent.split(color, key))?
        };
        match (member, child) {
            (Some(m), Some(comm)) => CudaGroup::start(
                m.cpu,
                self.inner.rt,
                self.inner.device,
                m.rank,
                m.size,
                &m.name,
                m.timeout,
                Some(comm),
            )
            .map(Some),
            (Some(_), None) => Err(Error::backend(
                "ncclCommSplit returned no communicator for a member",
            )),
            (None, _) => Ok(None),
        }
    }

    /// Whether [`CudaGroup::shrink`] can run: no communicator (staged), or NCCL >= 2.27.
    pub fn can_shrink(&self) -> bool {
        self.inner.comm.as_ref().is_none_or(|c| c.can_shrink())
    }

    /// The CUDA group of this group's ranks but `excluded` (sorted), renumbered in order,
    /// named `name` (torch's `shrink_group`; the remaining ranks call it): the communicator
    /// through ncclCommShrink (NCCL >= 2.27, else an error naming the NCCL loaded), the
    /// staging group through its own shrink. `abort_pending` aborts this group's pending
    /// operations first. This group is released by abort from here on, as NCCL asks of a
    /// shrunk communicator.
    pub fn shrink(&self, excluded: &[usize], abort_pending: bool, name: &str) -> Result<CudaGroup> {
        if !self.can_shrink() {
            // The same error the communicator gives, before anything changes.
            if let Some(comm) = &self.inner.comm {
                comm.shrink(excluded, abort_pending)?;
            }
        }
        let comm = match &self.inner.comm {
            Some(parent) => {
                let _device = DeviceGuard::set(self.inner.rt, self.inner.device)?;
                Some(
                    self.inner
                        .exclusive(|| parent.shrink(excluded, abort_pending))?,
                )
            }
            None => None,
        };
        let cpu = Arc::new(self.inner.cpu.shrink(excluded, abort_pending)?);
        let (rank, size) = (cpu.rank(), cpu.size());
        let group = CudaGroup::start(
            cpu,
            self.inner.rt,
            self.inner.device,
            rank,
            size,
            name,
            self.inner.timeout.get(),
            comm,
        )?;
        self.abort();
        Ok(group)
    }

    /// Leaves cleanly: queued operations still run, pending ones finish (bounded by the
    /// timeout: the watchdog fails them), then ncclCommFinalize + ncclCommDestroy and the
    /// staging group's shutdown. Blocks.
    pub fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        self.inner.shutdown(threads);
    }

    /// Aborts: the communicator and the staging group are aborted, every pending and later
    /// operation fails with DistBackendError. Does not wait for the group's threads (they end
    /// on their own).
    pub fn abort(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.abort();
    }
}

impl Drop for CudaGroup {
    fn drop(&mut self) {
        // Neither shut down nor aborted (e.g. the process is exiting): abort, as torch does.
        self.abort();
        crate::recorder::retire(&self.inner.recorder);
    }
}
