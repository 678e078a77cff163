"""Initialisation: every init method, the world queries, destroy_process_group and init again
in the same processes. Runs in worlds whose ranks start without a process group."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from harness import World, free_port, skip_if_torch, skip_torch_store_reinit

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world", [1, 2])
def test_use_before_init(bare_world: Callable[[int], World], world: int) -> None:
    bare_world(world).run("uninitialized")


@skip_torch_store_reinit
@pytest.mark.parametrize("method", ["env", "env_default", "tcp"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_init_tcp_rendezvous_twice_same_port(bare_world: Callable[[int], World], world: int,
                                             method: str) -> None:
    """Init, check, destroy, then init again on the SAME port in the same processes."""
    port = free_port()
    bare_world(world).run("init_and_destroy", method=method, ports=[port, port], paths=["", ""])


@pytest.mark.parametrize("method", ["file", "store_file"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_init_file(bare_world: Callable[[int], World], world: int, method: str, tmp_path: Path) -> None:
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    bare_world(world).run("init_and_destroy", method=method, ports=[0, 0], paths=paths)


@pytest.mark.parametrize("method", ["store_tcp", "store_torch_tcp"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_init_explicit_tcp_store(bare_world: Callable[[int], World], world: int, method: str) -> None:
    """store=: the library's own TCPStore, and torch.distributed.TCPStore."""
    bare_world(world).run("init_and_destroy", method=method, ports=[free_port(), free_port()],
                          paths=["", ""])


def test_init_explicit_hash_store(bare_world: Callable[[int], World]) -> None:
    bare_world(1).run("init_and_destroy", method="store_hash", ports=[0, 0], paths=["", ""])


@pytest.mark.parametrize("world", [1, 2])
def test_init_backend_none(bare_world: Callable[[int], World], world: int) -> None:
    """backend=None picks the default backend, as in unchanged torch scripts."""
    bare_world(world).run("init_and_destroy", method="env", ports=[free_port()], paths=[""],
                          backend=None)


def test_methods_one_after_another(bare_world: Callable[[int], World], tmp_path: Path) -> None:
    """env -> destroy -> tcp -> destroy -> file -> destroy -> store, in the same 3 processes."""
    w = bare_world(3)
    w.run("init_and_destroy", method="env", ports=[free_port()], paths=[""])
    w.run("init_and_destroy", method="tcp", ports=[free_port()], paths=[""])
    w.run("init_and_destroy", method="file", ports=[0], paths=[str(tmp_path / "f")])
    w.run("init_and_destroy", method="store_tcp", ports=[free_port()], paths=[""])
    w.run("uninitialized")


@pytest.mark.parametrize("world", [3, 4])
def test_destroy_right_after_barrier(bare_world: Callable[[int], World], world: int) -> None:
    """Ranks leaving barrier() first destroy their group at once; the slower ranks' barrier
    must still complete (several rounds, each on a fresh port, to catch the race)."""
    n = 8
    bare_world(world).run("init_and_destroy", method="env", ports=[free_port() for _ in range(n)],
                          paths=[""] * n)


@skip_if_torch("checks that torch.distributed sees rustdist's world (trivial in torch mode)")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_one_world(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("one_world")
