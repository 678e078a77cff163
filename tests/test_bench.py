"""``python -m rustdist.bench``: what can be checked fast and without timing. The selection
table's formatting (on a fake engine table), the options, the collectives' expected values
(against a numpy model of each collective), the plot writer, the progress bar, the launcher's
event files and rank hook, the soak's verdict, one real --quick run (results checked, times
not), --train ddp / fsdp2 on a tiny model (its figures' shape checked, times not), and
--vs deepspeed: its table, and a tiny real run where DeepSpeed is installed."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import rustdist._core as core  # noqa: E402
from rustdist.bench import (  # noqa: E402
    cli, deepspeed_shm, launch, plot, recovery, selection, soak, vs_deepspeed, window,
)
from rustdist.bench.common import (  # noqa: E402
    DEEPSPEED_SIZES, DTYPE_BYTES, OPS, SIZES, Config, bound_core, expected, fmt_size,
    input_values, layout, parse_size,
)
from rustdist.bench.progress import Progress  # noqa: E402

from harness import run_reaped  # noqa: E402

FAKE_TABLE = [
    ("all_reduce", "shm", 2, 8, "recursive_doubling"),
    ("all_reduce", "shm", 2, 4096, "recursive_doubling"),
    ("all_reduce", "shm", 2, 1 << 20, "ring"),
    ("all_reduce", "shm", 4, 8, "recursive_doubling"),
    ("all_reduce", "shm", 4, 4096, "recursive_doubling"),
    ("all_reduce", "shm", 4, 1 << 20, "ring"),
    ("all_reduce", "tcp", 2, 8, "recursive_doubling"),
    ("all_reduce", "tcp", 2, 4096, "ring"),
    ("all_reduce", "tcp", 2, 1 << 20, "ring"),
    ("broadcast", "hierarchical", 4, 8, "binomial_tree"),
    ("broadcast", "hierarchical", 4, 1 << 20, "pipelined_chain"),
]


@pytest.mark.timeout(30)
def test_selection_table_formatting() -> None:
    text = selection.format_selection(FAKE_TABLE)
    blocks = text.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["all_reduce", "broadcast"]
    head, rule, *rows = blocks[0].splitlines()[1:]
    assert [c.strip() for c in head.split("|")] == [
        "bytes", "shm world 2", "shm world 4", "tcp world 2"]
    assert set(rule) <= {"-", "+"}
    cells = [[c.strip() for c in r.split("|")] for r in rows]
    # 8 B: the same algorithms everywhere; 4 KiB differs on tcp, so no range spans both.
    assert cells == [
        ["8 B", "recursive_doubling", "recursive_doubling", "recursive_doubling"],
        ["4 KiB", "recursive_doubling", "recursive_doubling", "ring"],
        ["1 MiB", "ring", "ring", "ring"],
    ]
    # Every line of a table has the same column boundaries.
    assert len({line.index("|") for line in [head, *rows]}) == 1
    bcast = blocks[1].splitlines()
    assert "hierarchical world 4" in bcast[1]
    assert [r.split("|")[0].strip() for r in bcast[3:]] == ["8 B", "1 MiB"]


@pytest.mark.timeout(30)
def test_selection_ranges_merge_equal_rows() -> None:
    table = [("barrier", "shm", 2, s, "dissemination") for s in (8, 64, 512)]
    lines = selection.format_selection(table).splitlines()
    assert [c.strip() for c in lines[3].split("|")] == ["8 B .. 512 B", "dissemination"]
    assert len(lines) == 4


@pytest.mark.timeout(30)
def test_show_selection_prints_the_engine_table(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    asked = []

    def fake(worlds: list[int], sizes: list[int]) -> list[tuple[str, str, int, int, str]]:
        asked.append((worlds, sizes))
        return FAKE_TABLE

    monkeypatch.setattr(core, "selection_table", fake, raising=False)
    assert cli.main(["--show-selection", "--world", "2", "4", "--max-bytes", "4K"]) == 0
    assert asked == [([2, 4], [8, 64, 512, 4096])]
    assert "pipelined_chain" in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_missing_selection_table_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(core, "selection_table", raising=False)
    with pytest.raises(RuntimeError, match=r"rustdist\._core\.selection_table"):
        selection.selection_table([2], [8])
    with pytest.raises(SystemExit, match="selection_table"):
        cli.main(["--show-selection"])


@pytest.mark.timeout(30)
def test_options() -> None:
    args = cli.parse_args([])
    assert (args.mode, args.world, args.ops, args.sizes, args.vs) == (
        "compare", [2, 4], list(OPS), SIZES, None)
    args = cli.parse_args(["--world", "2", "--ops", "all_reduce", "--max-bytes", "4K",
                           "--quick", "--vs", "mpi", "--json", "x.json"])
    assert (args.world, args.ops, args.sizes, args.quick, args.vs, args.json) == (
        [2], ["all_reduce"], (8, 64, 512, 4096), True, "mpi", "x.json")
    assert cli.parse_args(["--device", "cuda"]).world == [1]
    soak_args = cli.parse_args(["--soak", "--soak-ops", "20000"])
    assert (soak_args.mode, soak_args.world, soak_args.soak_ops) == ("soak", [4], 20000)
    assert cli.parse_args(["--soak"]).soak_ops == 100_000
    assert cli._config(args, 2).rounds < cli._config(cli.parse_args([]), 2).rounds
    binds = [cli._config(cli.parse_args(a), 4).bind
             for a in ([], ["--vs", "mpi"], ["--vs", "mpi", "--no-bind"], ["--bind"])]
    assert binds == [False, True, False, True]
    ds = cli.parse_args(["--vs", "deepspeed"])
    assert (ds.mode, ds.world, ds.ops, ds.dtypes, ds.bind) == (
        "deepspeed", [2, 4], ["all_reduce"], list(DTYPE_BYTES), True)
    assert ds.sizes == DEEPSPEED_SIZES and ds.sizes[-1] == 16 << 20
    assert {8, 1 << 10, 64 << 10, 1 << 20, 16 << 20} <= set(ds.sizes)  # the sizes
    small = cli.parse_args(["--vs", "deepspeed", "--dtypes", "bfloat16", "--max-bytes", "64"])
    assert (small.dtypes, small.sizes) == (["bfloat16"], (8, 16, 64))
    assert cli._config(small, 2).dtypes == ("bfloat16",)
    assert args.dtypes == ["float32"] and cli._config(args, 2).dtypes == ("float32",)
    for bad in (["--world", "1"], ["--world", "0"], ["--soak", "--vs", "mpi"],
                ["--soak", "--device", "cuda"], ["--vs", "mpi", "--device", "cuda"],
                ["--max-bytes", "4"], ["--ops", "gather"], ["--max-bytes", "lots"],
                ["--vs", "deepspeed", "--ops", "broadcast"], ["--dtypes", "bfloat16"],
                ["--vs", "deepspeed", "--soak"]):
        with pytest.raises(SystemExit):
            cli.parse_args(bad)


@pytest.mark.timeout(30)
def test_recovery_options() -> None:
    """--recovery times reconfigure beside gloo at worlds 3 8 32 by default, shrink_group at
    2 3 4 with --recovery-api shrink_group; --link goes with shrink_group only."""
    args = cli.parse_args(["--recovery"])
    assert (args.mode, args.recovery_api, args.world) == ("recovery", "reconfigure", [3, 8, 32])
    args = cli.parse_args(["--recovery", "--recovery-api", "shrink_group"])
    assert (args.recovery_api, args.world) == ("shrink_group", [2, 3, 4])
    with pytest.raises(SystemExit):
        cli.parse_args(["--recovery", "--link", "1gbit"])


def test_window_options() -> None:
    """--window runs worlds 2 and 4 by default, and no other mode with it."""
    args = cli.parse_args(["--window"])
    assert (args.mode, args.world) == ("window", [2, 4])
    for bad in (["--window", "--vs", "mpi"], ["--window", "--soak"],
                ["--window", "--link", "1gbit"], ["--window", "--recovery"]):
        with pytest.raises(SystemExit):
            cli.parse_args(bad)


@pytest.mark.timeout(30)
def test_window_rsh_agent_runs_the_daemon_on_the_named_host(tmp_path: Path) -> None:
    """The rsh agent --window gives mpirun for the test hosts: it skips rsh's options, finds
    the host by its address and runs the command line after the prefix that enters it."""
    agent = tmp_path / "agent"
    agent.write_text(window.RSH_AGENT.format(python=sys.executable, table={
        "10.77.0.1": ["echo", "on host 0:"], "10.77.0.2": ["echo", "on host 1:"]}))
    agent.chmod(0o755)
    done = run_reaped([str(agent), "-x", "10.77.0.2", "orted", "--daemon", "1"], timeout=20)
    assert done.stdout.split() == ["on", "host", "1:", "sh", "-c", "orted", "--daemon", "1"], \
        done


_WINDOW_RESULT = {
    "world": 2,
    "latency": [{"bytes": 8, "rustdist_us": 0.3, "mpi_us": 0.45}],
    "bandwidth": [{"bytes": 65536, "rustdist_gbps": 30.0, "mpi_gbps": 20.0}],
    "round_trip": [{"bytes": 8, "put_signal_us": 2.0, "send_recv_us": 16.0}],
}


def test_window_table_ratios() -> None:
    """The --window table: each row with both sides and their ratio."""
    lines = window.rows(_WINDOW_RESULT)
    assert any(line.split() == ["8", "B", "0.30", "0.45", "1.50x"] for line in lines), lines
    assert any(line.split() == ["64", "KiB", "30.00", "20.00", "1.50x"] for line in lines)
    assert any(line.split() == ["8", "B", "2.00", "16.00", "8.00x"] for line in lines)


@pytest.mark.timeout(60)
def test_window_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason=plot.MISSING)
    path = window.write_plot([_WINDOW_RESULT], str(tmp_path / "w.json"), "test")
    assert path == str(tmp_path / "w-window.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", recovery.SCENARIOS)
def test_a_reconfigure_round_on_numpy_processes(scenario: str) -> None:
    """One round of --recovery through reconfigure on rustdist, world 3: processes without
    torch (the import swap on numpy arrays) lose a rank, re-form (alone, or with a spare that
    inits alone and joins) and check their first all_reduce; every figure is positive and in
    order."""
    got = recovery.reconfigure_round("rustdist", 3, scenario)
    assert 0 < got["detected"] <= got["reformed"] <= got["recovered"], got


@pytest.mark.timeout(30)
def test_ranks_are_bound_round_robin_only_where_they_outnumber_the_cores() -> None:
    assert [bound_core(r, 4, [0, 1]) for r in range(4)] == [0, 1, 0, 1]
    assert [bound_core(r, 3, [5, 2]) for r in range(3)] == [2, 5, 2]
    assert [bound_core(r, 2, [0, 1]) for r in range(2)] == [None, None]
    assert bound_core(0, 4, []) is None


@pytest.mark.timeout(30)
def test_sizes() -> None:
    assert [parse_size(t) for t in ("64M", "64MiB", "4k", "4KB", "8")] == [
        64 << 20, 64 << 20, 4096, 4096, 8]
    assert [fmt_size(n) for n in (8, 16, 4096, 64 << 20, 1536)] == [
        "8 B", "16 B", "4 KiB", "64 MiB", "1536 B"]


def _model(op: str, inputs: list[np.ndarray], world: int, chunk: int) -> list[np.ndarray]:
    """Every rank's result of `op`, computed directly."""
    if op == "all_reduce":
        return [sum(inputs)] * world
    if op == "broadcast":
        return [inputs[0]] * world
    if op == "all_gather":
        return [np.concatenate(inputs)] * world
    if op == "reduce_scatter":
        return [sum(inputs)[r * chunk:(r + 1) * chunk] for r in range(world)]
    return [np.concatenate([x[r * chunk:(r + 1) * chunk] for x in inputs]) for r in range(world)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("size", [8, 64, 4096])
def test_expected_values_match_the_collective(op: str, world: int, size: int) -> None:
    lay = layout(op, size, world)
    inputs = [input_values(lay, r) for r in range(world)]
    assert all(x.dtype == np.float32 and x.size == lay.n_in for x in inputs)
    for rank, got in enumerate(_model(op, inputs, world, lay.chunk)):
        where, want = expected(lay, rank)
        assert where == ("in" if op in ("all_reduce", "broadcast") else "out")
        assert want.size == (lay.n_in if where == "in" else lay.n_out)
        np.testing.assert_array_equal(got, want)
    # Sizes as nccl-tests: the whole tensor, in whole chunks of at least one element.
    chunked = op in ("all_gather", "reduce_scatter", "all_to_all")
    assert lay.nbytes == (4 * world * max(1, size // 4 // world) if chunked else size)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("op", OPS)
def test_check_fails_a_side_that_leaves_another_side_s_result(op: str) -> None:
    """The sides share buffers: a side whose call does nothing must fail its check even when
    the buffers hold the previous side's right answer; a right call passes."""
    import torch

    from rustdist.bench.sides import check

    lay = layout(op, 64, 2)
    inp, out = torch.empty(lay.n_in), torch.empty(lay.n_out)
    where, want = expected(lay, 1)
    result = inp if where == "in" else out

    def right() -> None:
        result.copy_(torch.from_numpy(want))

    right()  # what the previous side left
    assert not check(lambda: None, lay, 1, inp, out)
    assert check(right, lay, 1, inp, out)
    assert check(right, lay, 1, inp.numpy(), out.numpy())  # the MPI side's numpy views


def _fake_row(op: str, world: int, nbytes: int, us: float) -> dict[str, Any]:
    peers = {name: {"correct": True, "us": us * k, "busbw_gbps": nbytes / (us * k) / 1e3}
             for name, k in (("rustdist", 1), ("gloo", 20), ("mpi", 0.5))}
    return {"op": op, "world": world, "bytes": nbytes, "peers": peers, "speedup": {}}


@pytest.mark.timeout(60)
def test_plot_writer(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason=plot.MISSING)
    rows = [_fake_row(op, w, n, 10.0 + n / 1e3) for op in ("all_reduce", "broadcast")
            for w in (2, 4) for n in (8, 4096, 1 << 20)]
    rows[0]["peers"]["mpi"] = {"correct": False}  # a wrong side is left out of the lines
    paths = plot.write_plots(rows, str(tmp_path / "r.json"), "test")
    assert paths == [str(tmp_path / "r-all_reduce.png"), str(tmp_path / "r-broadcast.png")]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(p) > 1000


@pytest.mark.timeout(30)
def test_progress_writes_plain_lines_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    err = io.StringIO()
    bar = Progress(3, stream=err)
    bar.update(label="world 2 all_reduce 8 B")
    bar.print("a table row")
    bar.advance()
    bar.tick()
    bar.update(label="world 2 all_reduce 64 B")
    bar.close()
    lines = err.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in err.getvalue() and "\033" not in err.getvalue()
    assert lines[0].startswith("progress 0/3") and lines[0].endswith("all_reduce 8 B")
    assert lines[1].startswith("progress 1/3")
    assert capsys.readouterr().out == "a table row\n"
    half = Progress(2)
    half.done = 1
    assert half.text(60).startswith("[" + "#" * 20 + "." * 20 + "]")


@pytest.mark.timeout(30)
def test_follower_reads_only_complete_lines(tmp_path: Path) -> None:
    follower = launch.Follower(str(tmp_path), 2)
    assert follower.poll() == []
    out = launch.Emitter(str(tmp_path), 1)
    out.emit("row", op="all_reduce")
    with open(tmp_path / "rank0.jsonl", "w", encoding="utf-8") as f:
        f.write('{"event": "case", "rank": 0}\n{"event": "ha')
    assert follower.poll() == [{"event": "case", "rank": 0},
                               {"event": "row", "rank": 1, "op": "all_reduce"}]
    with open(tmp_path / "rank0.jsonl", "a", encoding="utf-8") as f:
        f.write('lf", "rank": 0}\n')
    assert follower.poll() == [{"event": "half", "rank": 0}]
    out.close()


@pytest.mark.timeout(30)
def test_soak_verdict() -> None:
    def sample(rank: int, ops: int, rss: float, fds: int = 9, threads: int = 2,
               correct: bool = True) -> dict[str, Any]:
        return {"rank": rank, "ops": ops, "rss_mib": rss, "fds": fds, "threads": threads,
                "correct": correct}

    good = [sample(r, ops, 500 + ops / 10_000) for r in (0, 1) for ops in (0, 10_000, 20_000)]
    assert soak.verdict(good) == []
    bad = good + [sample(0, 30_000, 530), sample(1, 30_000, 500, fds=10, threads=3),
                  sample(1, 40_000, 500, fds=10, threads=3, correct=False)]
    problems = soak.verdict(bad)
    assert any(p.startswith("rank 0: RSS grew 6.0%") for p in problems), problems
    assert "rank 1: fds 9 -> 10" in problems and "rank 1: threads 2 -> 3" in problems
    assert any("wrong all_reduce result at ops [40000]" in p for p in problems)


@pytest.mark.timeout(30)
def test_vs_mpi_without_mpirun_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="apt-get install openmpi-bin"):
        cli.main(["--vs", "mpi", "--world", "2", "--quick"])


@pytest.mark.timeout(60)
def test_cuda_without_a_gpu_exits_cleanly() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit, match="no CUDA device"):
        cli.main(["--device", "cuda"])


@pytest.mark.timeout(120)
def test_ranks_start_through_a_replaceable_launcher() -> None:
    """The hook for other launchers (network namespaces, say): run_world hands every rank's
    command and environment to the launcher and follows the handles it returns."""
    seen = []

    def launcher(commands: Any, envs: Any) -> list[Any]:
        seen.extend((list(c), e["RANK"], e["WORLD_SIZE"]) for c, e in zip(commands, envs))
        return launch.start_ranks(commands, envs)

    cfg = Config(mode="soak", world=2, ops=(), sizes=(), rounds=1, round_seconds=0.0,
                 max_iters=1, mpi=False, master_addr="127.0.0.1",
                 master_port=launch.free_port(), soak_ops=5, bind=False)
    events = launch.run_world(cfg, lambda ev: None, launcher=launcher)
    assert [(s[1], s[2]) for s in seen] == [("0", "2"), ("1", "2")]
    assert seen[0][0][-2:] == ["rustdist.bench.rank", seen[0][0][-1]]
    assert sorted((e["rank"], e["ops"]) for e in events) == [(0, 0), (0, 5), (1, 0), (1, 5)]
    assert all(e["correct"] for e in events)
    assert soak.verdict(events) == []


@pytest.mark.timeout(300)
def test_quick_run_writes_checked_rows(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = run_reaped([sys.executable, "-m", "rustdist.bench", "--world", "2", "--ops",
                    "all_reduce", "--max-bytes", "4K", "--quick", "--json", str(out)],
                   timeout=280, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    doc = json.loads(out.read_text())
    assert doc["peers"] == ["rustdist", "gloo"]
    rows = doc["results"]
    assert [(r["op"], r["world"], r["bytes"]) for r in rows] == [
        ("all_reduce", 2, n) for n in (8, 64, 512, 4096)]
    for r in rows:
        for peer in ("rustdist", "gloo"):
            assert r["peers"][peer]["correct"] is True
            assert r["peers"][peer]["us"] > 0 and len(r["peers"][peer]["rounds_us"]) == 5
        assert r["speedup"]["vs_gloo"] > 0
    assert [f["world"] for f in doc["front_door"]] == [2]
    assert all(doc["front_door"][0]["async"][k] > 0 for k in (
        "rustdist_us", "torch_front_door_us", "functional_us", "gloo_us", "gloo_functional_us"))
    assert doc["binding"] == "none"
    assert doc["summary"]["wrong"] == []
    assert "world 2 · all_reduce (float32)" in p.stdout


TINY_MODEL = ["--d-model", "32", "--layers", "1", "--vocab", "128", "--tokens", "8",
              "--train-steps", "2", "--train-passes", "2", "--world", "2"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["ddp", "fsdp2-mixed"])
def test_train_run_reports_every_side_against_its_floor(tmp_path: Path, kind: str) -> None:
    """--train on a tiny model at world 2: each side's step, floor, their ratio and the
    breakdown are there; DDP's buckets and FSDP2's collectives (bf16 with --mixed) are the
    ones the step issued."""
    out = tmp_path / "t.json"
    train = ["--train", "ddp"] if kind == "ddp" else ["--train", "fsdp2", "--mixed"]
    p = run_reaped([sys.executable, "-m", "rustdist.bench", *train, *TINY_MODEL,
                    "--json", str(out)], timeout=280, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    doc = json.loads(out.read_text())
    assert [(r["world"], r["side"]) for r in doc["results"]] == [
        (2, "gloo"), (2, "rustdist"), (2, "rustdist-swap")]
    for r in doc["results"]:
        s, raw = r["summary"], r["raw"]
        assert raw["passes"] == 2  # two worlds per side, two rounds each, pooled
        assert all(len(raw["samples"][part]) == 4 for part in ("step", "compute", "alone"))
        assert s["floor"] == pytest.approx(s["compute"] + s["alone"])
        assert s["step"] > 0 and s["floor"] > 0 and s["ratio"] > 0
        assert s["ratio_q1"] <= s["ratio"] <= s["ratio_q3"]
        assert s["cpu_main_step"] > 0 and s["cpu_main_compute"] > 0
        if kind == "ddp":
            assert raw["buckets"] and sum(raw["buckets"]) == 4 * raw["params"]
            # DDP's copies: the step's beyond its no_sync step's, in the floor they extend.
            assert s["copies"] == pytest.approx(raw["copies_ms"] - raw["compute_copies_ms"])
            assert 0 < s["ratio_with_copies"] <= s["ratio"] or s["copies"] <= 0
        else:
            assert s["ratio_with_copies"] is None and "compute_copies_ms" not in raw
            ops = {(op, dtype) for op, _, _, dtype in raw["collectives"]}
            assert ops == {("all_gather_into_tensor", "torch.bfloat16"),
                           ("reduce_scatter_tensor", "torch.bfloat16")}, ops
    assert "rustdist (import swap)" in p.stdout and "step/floor" in p.stdout


def _ds_row(world: int, dtype: str, nbytes: int, ds_us: float | None) -> dict[str, Any]:
    peers: dict[str, Any] = {p: {"correct": True, "us": us} for p, us in (
        ("rustdist-torch", 4.0), ("rustdist-swap", 1.0), ("gloo", 300.0))}
    if ds_us is not None:
        peers["deepspeed"] = {"correct": True, "us": ds_us}
    row = {"world": world, "op": "all_reduce", "dtype": dtype, "bytes": nbytes, "peers": peers}
    return {**row, "vs_deepspeed": vs_deepspeed.vs_deepspeed(row)}


@pytest.mark.timeout(30)
def test_vs_deepspeed_table_and_summary() -> None:
    rows = [_ds_row(2, "bfloat16", 8, 2.0), _ds_row(2, "bfloat16", 64, 8.0),
            _ds_row(2, "float16", 8, None)]
    assert rows[0]["vs_deepspeed"] == {"rustdist-torch": 0.5, "rustdist-swap": 2.0}
    assert rows[2]["vs_deepspeed"] == {}
    head = [c.strip() for c in vs_deepspeed.header().split("|")]
    assert head == ["size", "DeepSpeed us", "torch door us", "import swap us", "gloo us",
                    "torch door vs DS", "import swap vs DS"]
    assert [c.strip() for c in vs_deepspeed.fmt_row(rows[0]).split("|")] == [
        "8 B", "2.0", "4.0", "1.0", "300.0", "0.50x", "2.00x"]
    # DeepSpeed did not run for float16: its cells say so.
    assert [c.strip() for c in vs_deepspeed.fmt_row(rows[2]).split("|")][1::4] == ["-", "-"]
    table = vs_deepspeed.markdown_table(rows + [_ds_row(4, "bfloat16", 8, 9.0)], 2).splitlines()
    assert len(table) == 2 + 3 and table[0].startswith("| dtype | bytes | DeepSpeed shm (us) |")
    assert table[2] == "| bfloat16 | 8 B | 2.0 | 4.0 | 1.0 | 300 | 0.50x | 2.00x |"
    assert table[4].endswith("| — | 4.0 | 1.0 | 300 | — | — |")
    least = vs_deepspeed.summarize(rows, 1.0)["least_vs_deepspeed"]
    assert [(x["door"], x["dtype"], x["ratio"], x["bytes"], x["every_size"]) for x in least] == [
        ("rustdist-torch", "bfloat16", 0.5, 8, False),
        ("rustdist-swap", "bfloat16", 2.0, 8, True)]


@pytest.mark.timeout(30)
def test_vs_deepspeed_without_deepspeed_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(deepspeed_shm.importlib.util, "find_spec", lambda name: None)
    op = deepspeed_shm.build(str(tmp_path), say=print)
    assert op.problem is not None and "requirements-bench.txt" in op.problem
    assert op.dtypes(("float32", "bfloat16")) == ()


def _ds_segments() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("deepspeed_allreduce_buffer_")}


@pytest.mark.timeout(900)
def test_vs_deepspeed_quick_run(tmp_path: Path) -> None:
    """A tiny --vs deepspeed run (world 2, 8 B, bfloat16): every side right and timed, the
    ratios there, DeepSpeed's segments gone. Its op is built once into target/ (a minute or
    two the first time). CI's test venv has no DeepSpeed (requirements-bench.txt): it skips."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed (pip install -r requirements-bench.txt)")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": os.environ.get(
        "TORCH_EXTENSIONS_DIR", str(root / "target" / "torch-extensions"))}
    out = tmp_path / "ds.json"
    before = _ds_segments()
    p = run_reaped([sys.executable, "-m", "rustdist.bench", "--vs", "deepspeed", "--world",
                    "2", "--max-bytes", "8", "--dtypes", "bfloat16", "--quick", "--json",
                    str(out)], timeout=880, cwd=tmp_path, env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    doc = json.loads(out.read_text())
    if doc["deepspeed"]["skipped"]:
        pytest.skip(f"DeepSpeed's op cannot run here: {doc['deepspeed']['skipped']}")
    assert doc["mode"] == "deepspeed" and doc["deepspeed"]["dtypes"] == ["bfloat16"]
    assert doc["peers"] == list(vs_deepspeed.PEERS)
    (row,) = doc["results"]
    assert (row["world"], row["op"], row["dtype"], row["bytes"]) == (2, "all_reduce",
                                                                     "bfloat16", 8)
    for peer in vs_deepspeed.PEERS:
        assert row["peers"][peer]["correct"] is True
        assert row["peers"][peer]["us"] > 0 and len(row["peers"][peer]["rounds_us"]) == 5
    assert set(row["vs_deepspeed"]) == set(vs_deepspeed.DOORS)
    assert all(r > 0 for r in row["vs_deepspeed"].values())
    assert doc["summary"]["wrong"] == []
    assert "world 2 · all_reduce bfloat16" in p.stdout
    assert _ds_segments() <= before
