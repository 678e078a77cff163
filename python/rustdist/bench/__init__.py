"""Benchmark rustdist against torch.distributed's gloo (and Open MPI, NCCL, DeepSpeed's shm).

Run as ``python -m rustdist.bench`` (``./dev bench`` builds the wheel and runs it). Modes:

* default: rustdist vs gloo on CPU tensors; ``--vs mpi`` adds Open MPI through mpi4py.
* ``--vs deepspeed``: all_reduce in float32, bfloat16 and float16 against DeepSpeed's
  shared-memory ``inference_all_reduce``, rustdist through the torch door and the import swap,
  and gloo (``vs_deepspeed.py``, ``deepspeed_shm.py``).
* ``--device cuda``: rustdist's NCCL path vs torch's ProcessGroupNCCL on CUDA tensors.
* ``--soak``: 100,000 mixed operations through rustdist, watching memory, fds and threads.
* ``--scale``: a world's cost against its size (8 ... 512 ranks, numpy ranks without torch):
  init, first collective, threads, fds, RSS and idle CPU per rank, small collectives'
  latency, beside gloo where torch ranks fit (``scale.py``, docs/scale.md).
* ``--show-selection``: prints which algorithm rustdist's engine picks, runs nothing.

Worlds. For each world size the ranks are started once (``launch.py``): local processes, or
with ``--vs mpi`` one ``mpirun --allow-run-as-root --oversubscribe -np W`` job, so that every
rank holds an MPI communicator (mpi4py's ``COMM_WORLD``, Open MPI's defaults: shared memory
between ranks on one host). Every rank joins rustdist's world (the default group, on a free
port of 127.0.0.1) and a gloo group of the same ranks (``torch.distributed.new_group(
backend="gloo")``, torch's gloo as it is). With ``--vs`` (or ``--bind``), where a world has
more ranks than the host has cores, rank r is bound to core r mod cores before anything else
starts, as Open MPI binds ranks that fit: unbound, the scheduler keeps 3 ranks on one core of 2
for seconds at a time, which makes a collective 1.5x slower, and rounds of different peers then
see different packings. Every peer runs in the same bound processes. Without it (the default
against gloo) the ranks are where the scheduler puts them, as users' are.

Method. Collectives: all_reduce, broadcast (root 0), all_gather (into one tensor),
reduce_scatter (one tensor) and all_to_all (single tensor, equal splits), float32, 8 B to
64 MiB. For every (collective, size) each side's result is first checked against the expected
values on every rank (a wrong side is reported, not timed); then every side is warmed up and
the slowest rank's estimates set N, the number of calls per round, the same N for every side.
Rounds alternate between the sides, in forward and then reverse order (rustdist, gloo, MPI;
MPI, gloo, rustdist; ...). A round of one side is: the same barrier for every side
(rustdist's, then gloo's, then MPI's), then N back-to-back blocking calls; its time is the
slowest rank's mean per call, and a row reports the median over the rounds. MPI uses numpy
buffers (``comm.Allreduce`` in place, ``Bcast``, ``Allgather``, ``Reduce_scatter_block``,
``Alltoall``); rustdist and gloo use torch tensors through the same ``torch.distributed`` API.
On CUDA, ``torch.cuda.synchronize()`` precedes the barrier and ends each round.

Sizes and bandwidth follow nccl-tests: the size is the all_reduce/broadcast tensor, the
gathered tensor of all_gather, the input of reduce_scatter and each rank's send buffer of
all_to_all; algbw = size / time and busbw = algbw * 2(n-1)/n (all_reduce), * 1 (broadcast),
* (n-1)/n (the others). Speed-up = the other side's time / rustdist's time.

Front door: an 8-byte all_reduce through ``torch.distributed`` on rustdist's group against
the same call through rustdist's own API, timed the same way, in the same run.
"""

from .cli import main

__all__ = ["main"]
