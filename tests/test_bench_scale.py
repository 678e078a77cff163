"""``python -m rustdist.bench --scale`` at worlds 2 and 3, rustdist only: every row has its
figures, its collectives' results checked, and its ranks ran without torch (times not
checked)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the bench itself (its other modes) imports torch

from harness import run_reaped  # noqa: E402

FIGURES = ("init_s", "first_collective_s", "threads", "threads_median", "fds", "fds_median",
           "rss_mb", "rss_mb_median", "idle_cpu_pct", "idle_cpu_pct_max",
           "all_reduce_8B_us", "barrier_us", "all_reduce_1MiB_us")


@pytest.mark.timeout(240)
def test_scale_rows_have_checked_figures(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    p = run_reaped([sys.executable, "-m", "rustdist.bench", "--scale", "--world", "2", "3",
                    "--scale-sides", "rustdist", "--shm", "1", "0", "--scale-idle", "0.5",
                    "--scale-starts", "2",
                    "--quick", "--json", str(out)], timeout=220, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "scale" and "cpu" in doc["machine"] and "commit" in doc["machine"]
    rows = doc["results"]
    assert [(r["world"], r["label"]) for r in rows] == [
        (w, f"rustdist {links}") for w in (2, 3) for links in ("shm", "tcp")]
    for r in rows:
        assert r["status"] == "ok" and r["error"] is None, r
        assert r["torch_loaded"] is False  # the ranks ran without torch
        assert r["first_correct"] is True
        for key in FIGURES:
            assert isinstance(r[key], (int, float)) and r[key] >= 0, (key, r)
        assert 0 < r["init_s"] <= r["first_collective_s"]
        assert len(r["init_s_starts"]) == len(r["first_collective_s_starts"]) == 2
        assert r["threads"] >= r["threads_median"] >= 1 and r["rss_mb"] > 0
        assert set(r["cases"]) == {"all_reduce_8B", "barrier", "all_reduce_1MiB"}
        for case in r["cases"].values():
            assert case["correct"] is True and case["us"] > 0
            assert len(case["rounds_us"]) == 3
    assert "| world | side | status |" in p.stdout
