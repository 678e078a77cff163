"""Runs the two analyzers of flight recorder dumps over many directories in one process (each
costs seconds to start, for importing torch): ``python fr_analyze.py JOBS OUT``.

JOBS is a JSON file listing ``{"dir": ..., "prefix": ..., "fr_args": [...]}``; for each, this
runs exactly what these command lines run, as ``python -m`` does (``runpy``, as ``__main__``,
with ``sys.argv`` set), their output captured at the file descriptors:

    python -m torch.distributed.flight_recorder.fr_trace DIR --prefix PREFIX [FR_ARGS...]
    python -m rustdist.flight_recorder DIR --prefix PREFIX

and writes to OUT, as JSON, ``{dir: {"fr_trace": {"rc": ..., "out": ...}, "timeline": ...}}``
(``rc`` 0 for a normal end, the exit status for ``SystemExit``, 1 for an exception, whose
traceback is in ``out``). torch's analyzer is unmodified: only its module is run.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
import traceback
from typing import Any


def run_module(module: str, argv: list[str]) -> dict[str, Any]:
    """Runs ``python -m module argv...`` in this process; returns its exit status and what it
    wrote to stdout and stderr (interleaved)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        rc = 0
        try:
            sys.argv = [module, *argv]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - the analyzer crashed: that is the result
            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        out.seek(0)
        text = out.read().decode(errors="replace")
    return {"rc": rc, "out": text}


def main() -> None:
    jobs_path, out_path = sys.argv[1:3]
    with open(jobs_path) as f:
        jobs = json.load(f)
    results: dict[str, Any] = {}
    for job in jobs:
        d, prefix = job["dir"], job["prefix"]
        results[d] = {
            "fr_trace": run_module("torch.distributed.flight_recorder.fr_trace",
                                   [d, "--prefix", prefix, *job.get("fr_args", [])]),
            "timeline": run_module("rustdist.flight_recorder", [d, "--prefix", prefix]),
        }
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
