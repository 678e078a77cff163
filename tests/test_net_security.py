"""Hostile and unauthenticated network input, between real processes: RUSTDIST_AUTH_KEY on
TCPStore connections and on the peer connections of a process group (missing, wrong, one-sided
and right keys; refusals logged on the accepting side), and a timed-out store wait in torch's
words. (Fake peers with a wrong magic, job, group, size or rank, duplicates, floods and memory
are covered by the Rust tests in crates/core/src/transport/tcp/tests.rs and
store/tcp/tests.rs.)"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch.distributed as td

from harness import World, rustdist_only

from rustdist._core import FileStore, HashStore, PrefixStore, TCPStore

pytestmark = [pytest.mark.timeout(120), rustdist_only]

KEY = "RUSTDIST_AUTH_KEY"

CLIENT = """
import datetime, sys
from rustdist._core import TCPStore
try:
    s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=datetime.timedelta(seconds=20))
    s.set("from-child", "yes")
    print("ok", s.get("from-parent").decode())
except Exception as e:
    print(type(e).__name__, e)
"""


def run_client(port: int, key: Optional[str]) -> str:
    """A TCPStore client in a child process with `key` (None: unset); its one-line outcome."""
    env = {k: v for k, v in os.environ.items() if k != KEY}
    if key is not None:
        env[KEY] = key
    out = subprocess.run([sys.executable, "-c", CLIENT, str(port)], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_store_auth_between_processes(monkeypatch: pytest.MonkeyPatch,
                                      capfd: pytest.CaptureFixture[str]) -> None:
    """A keyed server refuses clients with no key or another key (DistNetworkError naming
    RUSTDIST_AUTH_KEY, at once), logs each refusal, and serves the client with its key."""
    monkeypatch.setenv(KEY, "s3cret")
    m = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
    m.set("from-parent", "hi")
    for key, why in [(None, "requires RUSTDIST_AUTH_KEY"), ("S3cret", "RUSTDIST_AUTH_KEY differs")]:
        out = run_client(m.port, key)
        assert out.startswith("DistNetworkError TCPStore: authentication failed"), out
        assert why in out, out
    assert not m.check(["from-child"])
    assert run_client(m.port, "s3cret") == "ok hi"
    assert m.get("from-child") == b"yes"
    err = capfd.readouterr().err
    refusals = [line for line in err.splitlines()
                if "TCPStore: refused a client from 127.0.0.1" in line]
    assert len(refusals) == 2 and all("authentication failed" in r for r in refusals), err


def test_store_key_on_the_client_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client with a key, a server without: the client is told the server has none."""
    monkeypatch.delenv(KEY, raising=False)
    m = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
    out = run_client(m.port, "k")
    assert "RUSTDIST_AUTH_KEY is set on this client but not on the TCPStore server" in out, out


def _key_env(key: Optional[str]) -> dict[str, Optional[str]]:
    """A rank's environment for the peer-auth cases: `key` (None: unset), default interface."""
    return {KEY: key, "RUSTDIST_SOCKET_IFNAME": None, "GLOO_SOCKET_IFNAME": None}


@pytest.mark.parametrize("key0,key1,why", [
    ("right", "wrong", "RUSTDIST_AUTH_KEY differs"),
    ("right", None, "requires RUSTDIST_AUTH_KEY, which is not set here"),
    (None, "right", "RUSTDIST_AUTH_KEY is set here but not there"),
])
def test_peer_auth_refuses_a_wrong_or_missing_key(short_world: Callable[..., World], tmp_path: Path,
                                                   key0: Optional[str], key1: Optional[str],
                                                   why: str) -> None:
    """Over a FileStore rendezvous (no TCP store in the way), rank 1's connection to rank 0 is
    refused: rank 1 raises DistNetworkError saying why; rank 0 logs the refusal and times out."""
    w = short_world(2, init=False)
    method = f"file://{tmp_path / 'rdv'}"
    res = w.run("net_cases:init_with_env", init_method=method, pg_timeout=4,
                per_rank={0: {"env": _key_env(key0)}, 1: {"env": _key_env(key1)}})
    r0, r1 = res
    assert not r1["ok"] and r1["type"] == "DistNetworkError", r1
    assert "rank 1 cannot connect to rank 0" in r1["msg"] and why in r1["msg"], r1["msg"]
    assert "authentication failed" in r1["msg"], r1["msg"]
    assert not r0["ok"] and "timed out waiting for ranks [1]" in r0["msg"], r0
    log = Path(w.logs[0]).read_text()
    assert "rank 0: dropped a connection from " in log, log


def test_peer_and_store_auth_with_the_right_key(short_world: Callable[..., World],
                                                tmp_path: Path) -> None:
    """The same key everywhere: env:// (TCP store) and file:// rendezvous both form the group."""
    w = short_world(3, init=False)
    for method in ("env://", f"file://{tmp_path / 'rdv'}"):
        for res in w.run("net_cases:init_with_env", init_method=method, env=_key_env("k3y")):
            assert res["ok"], res.get("trace")


@pytest.mark.timeout(60)
def test_store_wait_timeout_keeps_torch_words(tmp_path: Path) -> None:
    """A timed-out get or wait says what torch's TCPStore says ("wait timeout after 200ms,
    keys: ..."), on every store, naming the keys as the user wrote them (torch shows its
    internal "/" before each)."""
    t = datetime.timedelta(milliseconds=200)
    torch_store = td.TCPStore("127.0.0.1", 0, 1, True, timeout=t)
    with pytest.raises(td.DistStoreError) as torch_err:
        torch_store.get("nokey")
    torch_words = str(torch_err.value).replace("keys: /", "keys: ")
    assert torch_words == "wait timeout after 200ms, keys: nokey", torch_words
    stores = {
        "tcp": TCPStore("127.0.0.1", 0, is_master=True, timeout=t),
        "file": FileStore(str(tmp_path / "f")),
        "hash": HashStore(),
        "prefix": PrefixStore("p", HashStore()),
    }
    for name, store in stores.items():
        store.set_timeout(t)
        key = "p/nokey" if name == "prefix" else "nokey"
        with pytest.raises(td.DistStoreError) as err:
            store.get("nokey")
        assert str(err.value) == torch_words.replace("nokey", key), (name, str(err.value))
        store.set("here", "1")
        with pytest.raises(td.DistStoreError) as err:
            store.wait(["here", "a", "b"], t)
        missing = ", ".join(f"{'p/' if name == 'prefix' else ''}{k}" for k in ("a", "b"))
        assert str(err.value) == f"wait timeout after 200ms, keys: {missing}", (name, str(err.value))
