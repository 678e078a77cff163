"""Fixtures that hand out worlds of rank processes (see harness.py).

Shared worlds (sizes 1-4, process group initialised over env://) live for the whole session;
`bare_world` gives session-long worlds whose ranks have not called init_process_group (for
the init-method tests); `short_world` gives worlds that are killed when the test ends (for
tests that break their group on purpose).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Every process the tests start watches for warnings whose origin is rustdist (warn_guard.py).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.join(os.path.dirname(os.path.abspath(__file__)), "warn_site")]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

from harness import BACKEND, HOSTS_SPEC, MODE, World, close_session_hosts  # noqa: E402


def pytest_report_header(config: Any) -> str:
    hosts = f", ranks on test hosts {HOSTS_SPEC}" if HOSTS_SPEC else ""
    return f"rustdist tests: RUSTDIST_TEST_DIST={MODE} (backend {BACKEND!r}){hosts}"


@pytest.fixture(scope="session")
def _log_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("rank-logs"))


@pytest.fixture(scope="session")
def _pool(_log_dir: str) -> Iterator[dict[Any, World]]:
    pool: dict[Any, World] = {}
    yield pool
    for w in pool.values():
        w.close()
    close_session_hosts()


@pytest.fixture(scope="session")
def worlds(_pool: dict[Any, World], _log_dir: str) -> Callable[[int], World]:
    """worlds(n): the shared, initialised world of n ranks (started on first use)."""

    def get(size: int) -> World:
        key = ("init", size)
        if key not in _pool:
            _pool[key] = World(size, init=True, log_dir=_log_dir)
        return _pool[key].ensure()

    return get


@pytest.fixture(scope="session")
def bare_world(_pool: dict[Any, World], _log_dir: str) -> Callable[[int], World]:
    """bare_world(n): a shared world of n ranks that have not initialised a process group."""

    def get(size: int) -> World:
        key = ("bare", size)
        if key not in _pool:
            _pool[key] = World(size, init=False, log_dir=_log_dir)
        return _pool[key].ensure()

    return get


@pytest.fixture
def short_world(_log_dir: str) -> Iterator[Callable[..., World]]:
    """short_world(n, **kw): a fresh world for this test only, killed at its end."""
    made: list[World] = []

    def make(size: int, init: bool = True, pg_timeout: float = 15.0) -> World:
        w = World(size, init=init, pg_timeout=pg_timeout, log_dir=_log_dir)
        made.append(w)
        return w.ensure()

    yield make
    for w in made:
        w.kill()
