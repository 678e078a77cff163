"""``python -m rustdist.status``: a running job asked what each rank is doing, through both
front doors, on shared memory, TCP and the test hosts (as the suite's run sets them): a rank
computing while the others wait in an all_reduce, a rank waiting in another group's
collective, a killed rank; the job goes on unharmed after being asked (cases in
status_cases.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from harness import BACKEND, HOSTS_SPEC, IS_TORCH, World, free_port, reaped, session_hosts
from status_cases import RELEASE

from rustdist import status

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(IS_TORCH and BACKEND == "gloo",
                       reason="rustdist's status query: gloo ranks do not answer it"),
]

#: How long the driver waits for the job to reach the state a scenario sets up.
SETTLE_S = 30.0


def _address(w: World) -> str:
    return f"{w.master_addr}:{w.port}"


def _near_the_job(w: World, argv: list[str]) -> str:
    """Runs ``argv`` where the job's addresses can be reached (on a test host when the
    world's ranks are on them: their addresses exist only there); returns its output."""
    hosts = w.hosts if w.hosts is not None else session_hosts()
    run: Any = subprocess.run if hosts is None else functools.partial(hosts.run, 0)
    done = run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return str(done.stdout)


def _ask(w: World, *options: str) -> str:
    """What ``python -m rustdist.status`` prints about the job."""
    return _near_the_job(w, [sys.executable, "-m", "rustdist.status", _address(w), *options])


def _ask_until(w: World, settled: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """The job's status (``--json``) once ``settled`` says it has reached the scenario's state
    (ranks notify before they enter their operations, so the first answers may come
    earlier)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        ranks: list[dict[str, Any]] = json.loads(_ask(w, "--json", "--timeout", "1"))
        if settled(ranks) or time.monotonic() > deadline:
            return ranks
        time.sleep(0.05)  # polling a condition, with a deadline


def _release(w: World, tag: str) -> None:
    """Sets the key the held ranks wait for, through the job's own kind of store client."""
    client = "torch.distributed" if IS_TORCH else "rustdist"
    _near_the_job(w, [sys.executable, "-c", (
        f"import datetime, {client} as d; "
        f"d.TCPStore({w.master_addr!r}, {w.port}, None, False, "
        f"datetime.timedelta(seconds=30)).set({RELEASE + tag!r}, '1')")])


def _group(rank: dict[str, Any], desc: str = "default_pg") -> dict[str, Any]:
    """The rank's group described ``desc`` (torch's group_desc). Other groups the shared
    worlds' earlier tests left behind may be in operations of their own."""
    return next(g for g in rank["groups"] if g["desc"] == desc)


def _current(rank: dict[str, Any], desc: str = "default_pg") -> Any:
    return _group(rank, desc)["current"]


def _waits(rank: dict[str, Any]) -> list[int]:
    """The ranks it waits for in the world's group."""
    return list(_group(rank)["waits_for"])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_others_wait_for_a_rank_that_computes(short_world: Callable[..., World],
                                                  world: int) -> None:
    w = short_world(world)
    busy, tag = world - 1, uuid.uuid4().hex
    w.submit("status_cases:one_rank_computes", busy=busy, tag=tag)
    w.wait_notes(list(range(world)), "status_cases:one_rank_computes")

    def settled(ranks: list[dict[str, Any]]) -> bool:
        return all(_waits(r) == [busy] for r in ranks if r["rank"] != busy)

    ranks = _ask_until(w, settled)
    try:
        assert [r["rank"] for r in ranks] == list(range(world))
        assert all(r["alive"] and r["pid"] > 0 and r["host"] for r in ranks), ranks
        for r in ranks:
            if r["rank"] == busy:
                assert _current(r) is None, r
                assert _waits(r) == [], r
            else:
                cur = _current(r)
                assert cur["op"] == "all_reduce" and cur["state"] == "started", r
                assert _waits(r) == [busy], r
        words = "\n".join(status.verdict(ranks))
        assert f"rank {busy} is in no operation" in words, words
        assert f"for {busy}:" in words, words
    finally:
        _release(w, tag)
    results = w.collect(list(range(world)), "status_cases:one_rank_computes")
    assert results == [[float(sum(range(world)))] * 4] * world


@pytest.mark.parametrize("world", [3, 4])
def test_a_rank_waits_in_another_group(short_world: Callable[..., World], world: int) -> None:
    w = short_world(world)
    last, tag = world - 1, uuid.uuid4().hex
    w.submit("status_cases:one_rank_in_another_group", tag=tag)
    w.wait_notes(list(range(world)), "status_cases:one_rank_in_another_group")

    def pair(rank: dict[str, Any]) -> Any:
        return next((g for g in rank["groups"] if g["ranks"] == [0, last] and g["current"]),
                    None)

    def settled(ranks: list[dict[str, Any]]) -> bool:
        in_pair = pair(ranks[last])
        return (all(_waits(r) == [last] for r in ranks if r["rank"] != last)
                and in_pair is not None and in_pair["waits_for"] == [0])

    ranks = _ask_until(w, settled)
    try:
        for r in ranks:
            if r["rank"] != last:
                assert _waits(r) == [last], r
        in_pair = pair(ranks[last])
        assert in_pair and in_pair["current"]["op"] == "all_reduce", ranks[last]
        assert in_pair["waits_for"] == [0], ranks[last]
        words = "\n".join(status.verdict(ranks))
        assert f"rank {last} is in all_reduce" in words, words
        assert "rank 0 is in all_reduce" in words and "default_pg" in words, words
    finally:
        _release(w, tag)
    w.collect(list(range(world)), "status_cases:one_rank_in_another_group")


@pytest.mark.parametrize("world", [2, 3])
def test_a_killed_rank_shows_as_dead(short_world: Callable[..., World], world: int) -> None:
    w = short_world(world)
    victim = world - 1
    w.exit_rank(victim)
    ranks = json.loads(_ask(w, "--json"))
    for r in ranks:
        assert r["alive"] == (r["rank"] != victim), ranks
    assert f"no answer from rank(s) {victim}" in "\n".join(status.verdict(ranks))


def test_the_command_line_prints_a_row_per_rank(short_world: Callable[..., World]) -> None:
    text = _ask(short_world(2))
    rows = [line.split()[0] for line in text.splitlines()[1:] if line[:1].isdigit()]
    assert rows == ["0", "1"], text
    assert "no rank waits for another" in text, text


@pytest.mark.skipif(bool(HOSTS_SPEC), reason="the command runs on this host, where the test "
                    "hosts' addresses do not exist")
def test_watch_asks_again_and_again(short_world: Callable[..., World]) -> None:
    w = short_world(2)
    cmd = [sys.executable, "-m", "rustdist.status", _address(w), "--json", "--watch", "0.1"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as watching:
        try:
            assert watching.stdout is not None
            for _ in range(3):  # one JSON line per round
                ranks = json.loads(watching.stdout.readline())
                assert [r["rank"] for r in ranks] == [0, 1] and all(r["alive"] for r in ranks)
        finally:
            watching.kill()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_counters_against_known_traffic(worlds: Callable[[int], World], world: int) -> None:
    w = worlds(world)
    results = w.run("status_cases:known_traffic")
    for counters in results:
        ops = counters["ops"]
        assert ops["all_reduce"] == {"count": 3, "bytes": 3 * 4 * 4}, counters
        assert ops["broadcast"] == {"count": 2, "bytes": 2 * 8 * 8}, counters
        assert ops["barrier"]["count"] == 1, counters
        runs = counters["algorithms"]
        for collective, n in (("all_reduce", 3), ("broadcast", 2), ("barrier", 1)):
            assert sum(v for k, v in runs.items() if k.startswith(collective + "/")) == n, runs
        assert counters["waited_s"] >= 0, counters
    try:
        if world > 1:  # alone, a rank has no heartbeats to answer the query
            ranks = json.loads(_ask(w, "--json"))
            for r in ranks:  # the counted group's counters, as the rank itself read them
                assert any(g["stats"]["ops"] == results[r["rank"]]["ops"] for g in r["groups"]), r
            text = _ask(w, "--metrics")
            assert text.rstrip().endswith("# EOF"), text
            assert "# TYPE rustdist_operations counter" in text, text
            for r in range(world):
                assert f'rustdist_up{{rank="{r}"}} 1' in text, text
                assert any(line.startswith("rustdist_operations_total{") and f'rank="{r}"' in line
                           and 'op="broadcast"' in line and line.endswith(" 2")
                           for line in text.splitlines()), text
    finally:
        w.run("status_cases:forget_known_traffic")
    if world > 1:  # the world-wide group, made and destroyed since, took no rank's place
        assert all(r["alive"] for r in json.loads(_ask(w, "--json")))


@pytest.mark.skipif(bool(HOSTS_SPEC), reason="torchrun's ranks run on this host, not on test hosts")
def test_a_torchrun_job(tmp_path: Path) -> None:
    """A job under torchrun (the torch door; the ranks publish in torchrun's store, torch's
    TCPStore): the query finds it at torchrun's master address and names the computing
    rank; the job then finishes."""
    port, release = free_port(), RELEASE + uuid.uuid4().hex
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(Path(__file__).parent / "status_prog.py")]
    with reaped() as tag:
        env = {**os.environ, **tag, "OMP_NUM_THREADS": "1", "RUSTDIST_TEST_RELEASE": release}
        job = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        address = f"127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:  # until the ranks have published and ranks 0 and 2 wait (bounded)
                try:
                    ranks = status.query(address)
                    if all(r["waits_for"] == [1] for r in ranks if r["rank"] != 1):
                        break
                except Exception:  # noqa: BLE001 - the job is still starting
                    pass
                assert time.monotonic() < deadline and job.poll() is None, "job never settled"
                time.sleep(0.1)  # polling a condition, with a deadline
            assert [r["rank"] for r in ranks] == [0, 1, 2] and all(r["alive"] for r in ranks)
            assert "rank 1 is in no operation" in "\n".join(status.verdict(ranks))
        finally:
            from torch.distributed import TCPStore

            TCPStore("127.0.0.1", port, None, False).set(release, "1")
            out, _ = job.communicate(timeout=120)
    assert job.returncode == 0, out[-4000:]
    assert out.count("all_reduce ok") == 3, out[-4000:]


@pytest.mark.skipif(bool(HOSTS_SPEC), reason="the job's ranks run on this host, not on test hosts")
def test_under_a_key_only_signed_queries_are_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """RUSTDIST_AUTH_KEY: the command with the job's key sees the job; without it, or with
    another, the store refuses it; a rank ignores a query signed with another key (shown
    dead to it), and answers one signed with the job's."""
    from rustdist import TCPStore, _core

    port, release, world = free_port(), RELEASE + uuid.uuid4().hex, 2
    address = f"127.0.0.1:{port}"
    with reaped() as tag:
        base = {**os.environ, **tag, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
        keyed = {**base, "RUSTDIST_AUTH_KEY": "the-job's-key"}
        prog = str(Path(__file__).parent / "status_prog.py")
        ranks = [subprocess.Popen([sys.executable, prog, "swap"],
                                  env={**keyed, "RANK": str(r), "RUSTDIST_TEST_RELEASE": release},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]

        def ask(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "rustdist.status", address, "--json"],
                                  env=env, capture_output=True, text=True, timeout=60)

        try:
            deadline = time.monotonic() + 120
            while True:  # until rank 0 waits for rank 1 (bounded)
                done = ask(keyed)
                if done.returncode == 0 and json.loads(done.stdout)[0]["waits_for"] == [1]:
                    break
                assert time.monotonic() < deadline, done.stderr[-2000:]
                time.sleep(0.1)  # polling a condition, with a deadline
            for env in (base, {**base, "RUSTDIST_AUTH_KEY": "another"}):
                refused = ask(env)
                assert refused.returncode != 0, refused.stdout
                assert "RUSTDIST_AUTH_KEY" in refused.stderr, refused.stderr[-2000:]
            monkeypatch.setenv("RUSTDIST_AUTH_KEY", "the-job's-key")
            store = TCPStore("127.0.0.1", port, None, False)
            addrs = [json.loads(v)["addr"] for v in
                     store.multi_get([f"{status.KEY_PREFIX}{r}" for r in range(world)])]
            assert all(_core.ask_status(addrs, 1.0)), addrs
            monkeypatch.setenv("RUSTDIST_AUTH_KEY", "another")
            assert _core.ask_status(addrs, 0.5) == [None] * world
            store.set(release, "1")
            outs = [p.communicate(timeout=120)[0] for p in ranks]
        finally:
            for p in ranks:
                p.kill()
    assert all(p.returncode == 0 for p in ranks), outs
    assert all("all_reduce ok" in out for out in outs), outs
