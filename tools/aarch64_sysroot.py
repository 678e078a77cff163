"""Builds the aarch64 root that tests/test_aarch64.py starts its ranks in under qemu-user:
Debian's arm64 Python 3.11 with the libraries it loads (the packages apt resolves for it,
unpacked with dpkg-deb, not installed), and numpy's manylinux aarch64 wheel unpacked in
``site/``.

    python tools/aarch64_sysroot.py ROOT [--numpy VERSION]

./dev runs it with the venv's python, so numpy defaults to the venv's version. apt runs on
state of its own beside ROOT (arm64 package lists only): this system's dpkg database and
architectures stay as they are, and no root is needed. A ROOT built for the same packages
and numpy (its stamp file says) is kept as it is; otherwise a new one is built beside it and
moved in place once complete, so an interrupted build never passes for a built one.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Optional

#: What the root is for: the interpreter, its standard library (ctypes, json, ...), and the
#: C++ runtime numpy's manylinux wheel links (manylinux lets a wheel take it from the system).
PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6")
#: The wheels an aarch64 bookworm (glibc 2.36) takes: pip matches the tags given, no others.
PLATFORMS = [f"manylinux_2_{minor}_aarch64" for minor in range(17, 37)]
#: Bumped when what the root holds changes in a way the stamp does not show.
FORMAT = 1
STAMP = ".aarch64-root.json"


def apt_options(state: Path) -> list[str]:
    """apt on `state` (lists, cache, an empty dpkg status: nothing counts as installed),
    for arm64 alone, with this system's sources."""
    return [
        "-q", "-o", f"Dir::State={state}/state", "-o", f"Dir::State::status={state}/status",
        "-o", f"Dir::Cache={state}/cache", "-o", "APT::Architecture=arm64",
        "-o", "APT::Architectures::=arm64", "-o", "Debug::NoLocking=1",
        # Downloads go to a folder of ours; as root apt would try its _apt user first.
        "-o", "APT::Sandbox::User=root",
    ]


def run(cmd: list[str], cwd: Optional[Path] = None) -> str:
    """Runs `cmd`; its output, or its error (with that output) when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({p.returncode}):\n"
                         f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout


def debian_packages(work: Path) -> list[Path]:
    """Downloads PACKAGES and everything they depend on (what apt would install on an empty
    arm64 system, recommends aside) into `work`/debs; returns the .deb files."""
    state = work / "apt"
    for d in ("state/lists/partial", "cache/archives/partial", "debs"):
        (state / d).mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    opts = apt_options(state)
    run(["apt-get", *opts, "update"])
    plan = run(["apt-get", *opts, "--simulate", "--no-install-recommends", "install",
                *PACKAGES])
    names = [line.split()[1] for line in plan.splitlines() if line.startswith("Inst ")]
    if not set(PACKAGES) <= set(names):
        raise SystemExit(f"apt's plan for {PACKAGES} misses some of them:\n{plan}")
    run(["apt-get", *opts, "download", *names], cwd=state / "debs")
    return sorted((state / "debs").glob("*.deb"))


def numpy_wheel(version: str, into: Path) -> Path:
    """Downloads numpy `version`'s aarch64 wheel for CPython 3.11 into `into`."""
    run([sys.executable, "-m", "pip", "download", "-q", f"numpy=={version}", "--no-deps",
         "--only-binary=:all:", *(f"--platform={p}" for p in PLATFORMS), "--python-version", "3.11",
         "--implementation", "cp", "--abi", "cp311", "-d", str(into)])
    found = sorted(into.glob("numpy-*.whl"))
    if len(found) != 1:
        raise SystemExit(f"pip downloaded {found} for numpy=={version}")
    return found[0]


def build(root: Path, want: dict[str, object], numpy: str) -> None:
    """Builds the root in a folder beside it, then puts it in its place."""
    work = root.with_name(root.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    debs = debian_packages(work)
    for deb in debs:
        run(["dpkg-deb", "-x", str(deb), str(work)])
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(numpy_wheel(numpy, Path(tmp))) as z:
            z.extractall(work / "site")
    shutil.rmtree(work / "apt")
    python = work / "usr" / "bin" / "python3.11"
    if not python.is_file():
        raise SystemExit(f"{python} is missing after unpacking {len(debs)} packages")
    (work / STAMP).write_text(json.dumps(want) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    work.rename(root)
    print(f"aarch64 root: {root} built in {time.monotonic() - started:.0f} s "
          f"({len(debs)} Debian packages, numpy {numpy})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--numpy", help="numpy's version (default: this Python's)")
    args = parser.parse_args()
    numpy = args.numpy or importlib.metadata.version("numpy")
    root: Path = args.root.resolve()
    want: dict[str, object] = {"format": FORMAT, "packages": list(PACKAGES), "numpy": numpy}
    stamp = root / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        print(f"aarch64 root: {root} (kept: Debian's Python 3.11, numpy {numpy})")
        return
    build(root, want, numpy)


if __name__ == "__main__":
    main()
