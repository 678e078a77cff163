"""DeepSpeed's shared-memory all_reduce as a side (``--vs deepspeed``): building its op,
the environment it needs, and its side in a rank.

``deepspeed.comm.inference_all_reduce`` (SUM only; what DeepSpeed's tensor-parallel CPU
inference calls) runs the op ``deepspeed_shm_comm``, which DeepSpeed builds from its C++
sources (``deepspeed/ops/csrc/cpu/comm/``) with the system's C++ compiler and ninja at first
use, into ``TORCH_EXTENSIONS_DIR``. The launcher builds it once, in a child process
(:func:`build`), before any world starts; a rank then only loads it. Where the op cannot
run, the call falls back to ``torch.distributed.all_reduce`` without a word: on a CPU
without the vector instructions its dtype needs, or (in older releases) where ``LOCAL_SIZE``
is not the world size. In a rank that would time torch's default group (rustdist's) under
DeepSpeed's name, so :func:`rank_sides` makes ``torch.distributed.all_reduce`` raise while
DeepSpeed's side is called.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NoReturn, Optional

from .common import Config
from .sides import Call, Side, torch_alloc, torch_side

#: The vector kernel level DeepSpeed's op needs per dtype (deepspeed/comm/torch.py,
#: ``inference_all_reduce``: AVX2 for float32, AVX-512BW for bfloat16 and float16); below it
#: the call falls back to torch.distributed.all_reduce.
KERNEL_LEVEL = {"float32": 1, "bfloat16": 2, "float16": 2}
LEVEL_NAMES = {0: "no AVX2", 1: "AVX2", 2: "AVX-512BW"}
#: A segment of DeepSpeed's shared memory (deepspeed/ops/csrc/cpu/comm/shm.cpp,
#: ``shm_initialize``): about 66 MiB per rank, which DeepSpeed never unlinks.
SEGMENT = "/dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"
#: How long the first build may take (a minute or two on 2 busy cores).
BUILD_TIMEOUT_S = 900
INSTALL = "pip install -r requirements-bench.txt"
_LEVEL_MARK = "vector kernel level: "


@dataclass(frozen=True)
class Op:
    """DeepSpeed's shared-memory op on this machine, as :func:`build` found it."""

    version: Optional[str]  # DeepSpeed's, None where it is not installed
    build_dir: str  # TORCH_EXTENSIONS_DIR of the build and of the ranks
    compiler: Optional[str]  # the first line of the C++ compiler's --version
    level: int  # the vector kernel level it was built for (see KERNEL_LEVEL)
    seconds: float  # how long building (or finding built) and loading it took
    problem: Optional[str]  # why it cannot run here, or None

    def dtypes(self, wanted: tuple[str, ...]) -> tuple[str, ...]:
        """Those of `wanted` that the op runs (none where it has a problem)."""
        return () if self.problem else tuple(d for d in wanted if self.level >= KERNEL_LEVEL[d])


def build_dir(json_path: str) -> str:
    """Where the op is built: TORCH_EXTENSIONS_DIR where it is set, else beside the results
    (not torch's cache in the home directory); a later run finds it built."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(json_path)), "bench-torch-extensions")


def _ninja_dir() -> Optional[str]:
    """The folder of a ninja to put on PATH: PyPI's ninja installs it beside the venv's python,
    which is not on PATH when the venv's python runs without activation."""
    found = shutil.which("ninja")
    if found:
        return os.path.dirname(found)
    try:
        import ninja
    except ImportError:
        return None
    return str(ninja.BIN_DIR)


@contextlib.contextmanager
def environment(directory: str) -> Iterator[None]:
    """The environment the build and the ranks (which inherit it) need: DeepSpeed's CPU
    accelerator (not CUDA where torch sees a GPU), the build folder, ninja on PATH."""
    ninja_dir = _ninja_dir()
    path = os.environ.get("PATH", "")
    want = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": directory,
            "PATH": f"{ninja_dir}{os.pathsep}{path}" if ninja_dir else path}
    saved = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _compiler() -> Optional[str]:
    """The C++ compiler torch's extension builder runs (CXX, else c++), in its own words."""
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        return None
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return (out.stdout.splitlines() or [cxx])[0]


def build(directory: str, say: Callable[[str], None]) -> Op:
    """Builds DeepSpeed's op into `directory` (or finds it built there) and loads it, in a
    child process under :func:`environment`; the reason where it cannot. `say` hears what
    is about to take a while."""

    def op(level: int = 0, seconds: float = 0.0, problem: Optional[str] = None) -> Op:
        return Op(version, directory, compiler, level, seconds, problem)

    version: Optional[str] = None
    compiler: Optional[str] = None
    if importlib.util.find_spec("deepspeed") is None:
        return op(problem=f"DeepSpeed is not installed ({INSTALL})")
    version = importlib.metadata.version("deepspeed")
    compiler = _compiler()
    if compiler is None:
        return op(problem=f"no C++ compiler ({os.environ.get('CXX', 'c++')}) to build its "
                          "op: apt-get install g++")
    if _ninja_dir() is None:
        return op(problem=f"ninja, which builds its op, is not installed ({INSTALL})")
    say(f"DeepSpeed {version}: its shared-memory op is built at first use with the system's "
        f"C++ compiler ({compiler}) and ninja, into {directory} (a minute or two; later runs "
        "find it built) ...")
    start = time.monotonic()
    with environment(directory):
        try:
            child = subprocess.run([sys.executable, "-m", __name__], capture_output=True,
                                   text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return op(problem=f"building its op took over {BUILD_TIMEOUT_S} s")
    seconds = time.monotonic() - start
    lines = child.stdout.splitlines()
    if child.returncode or not lines or not lines[-1].startswith(_LEVEL_MARK):
        tail = (child.stdout + child.stderr).strip().splitlines()[-12:]
        return op(seconds=seconds, problem="its op did not build or load:\n  "
                                           + "\n  ".join(tail))
    return op(int(lines[-1][len(_LEVEL_MARK):]), seconds)


def _load_op() -> None:
    """The build's child: builds or loads the op and prints its vector kernel level last."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    # As deepspeed/comm/torch.py's build_shm_op decides whether to use it.
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        sys.exit("DeepSpeed's CPU accelerator has no shared-memory op for this system")
    print(f"{_LEVEL_MARK}{builder.load(verbose=False).vector_kernel_level()}")


def _refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise RuntimeError(
        "deepspeed.comm.inference_all_reduce called torch.distributed.all_reduce: its shared "
        "memory is not in use (LOCAL_SIZE not the world size, or this CPU lacks the vector "
        "instructions of this dtype), and its figure would be torch's default group's "
        "(rustdist's). No DeepSpeed figure is reported from such a call.")


def _join(cfg: Config, rank: int) -> Any:
    """DeepSpeed's communication module, joined on torch's default group (rustdist's, which
    it wraps as it is: it makes no group of its own) with its shared memory mapped."""
    import rustdist as rd

    # What DeepSpeed's launcher sets: the op maps shared memory only where LOCAL_SIZE is the
    # world size, and names its segments after MASTER_ADDR and MASTER_PORT (the store's port,
    # which no other world on this host has while this one runs).
    os.environ.update(LOCAL_SIZE=str(cfg.world), LOCAL_RANK=str(rank),
                      MASTER_ADDR=cfg.master_addr, MASTER_PORT=str(cfg.master_port))
    import deepspeed.comm as ds

    with contextlib.redirect_stdout(io.StringIO()):  # "... built successfully", every rank
        ds.init_distributed(dist_backend="gloo", verbose=False)
    # Every rank has mapped every segment: the names can go now, so that no run, however it
    # ends, leaves 66 MiB per rank in /dev/shm; the memory goes with the last mapping.
    rd.barrier()
    segment = SEGMENT.format(uid=os.getuid(), addr=cfg.master_addr, port=cfg.master_port,
                             rank=rank)
    try:
        os.unlink(segment)
    except FileNotFoundError:
        print(f"rank {rank}: DeepSpeed's segment {segment} is not there to remove (another "
              "DeepSpeed release names them otherwise?): look for its segments in /dev/shm",
              file=sys.stderr)
    return ds


def _deepspeed_side(ds: Any, dtype: str) -> Side:
    def make_call(op: str, inp: Any, out: Any) -> Call:
        return lambda: ds.inference_all_reduce(inp)

    return Side("deepspeed", torch_alloc(dtype), make_call, dtype=dtype)


@contextlib.contextmanager
def rank_sides(cfg: Config, rank: int, gloo: Any) -> Iterator[Callable[[str], list[Side]]]:
    """This rank's sides of a dtype: rustdist through the torch door (torch's default group is
    rustdist's), through the import swap, DeepSpeed's op (for the dtypes of
    ``cfg.deepspeed``) and gloo (on `gloo`). While open, ``torch.distributed.all_reduce``
    raises (:func:`_refuse`); the torch door and gloo call torch's function as it was."""
    import torch.distributed as td

    import rustdist as rd

    # torch.distributed's functions as they are now, for the sides that call them: an
    # attribute lookup on it costs what one on the module costs.
    torch_api = types.SimpleNamespace(**vars(td))
    ds = _join(cfg, rank) if cfg.deepspeed else None

    def sides(dtype: str) -> list[Side]:
        mine = [torch_side("rustdist-torch", torch_api, dtype=dtype),
                torch_side("rustdist-swap", rd, dtype=dtype)]
        if ds is not None and dtype in cfg.deepspeed:
            mine.append(_deepspeed_side(ds, dtype))
        return mine + [torch_side("gloo", torch_api, group=gloo, dtype=dtype)]

    td.all_reduce = _refuse
    try:
        yield sides
    finally:
        td.all_reduce = torch_api.all_reduce


if __name__ == "__main__":
    _load_op()
