"""Tests of the stores of rustdist._core against torch.distributed's store API and semantics.

Runs real servers and real processes on 127.0.0.1: TCPStore shared by two processes, FileStore
shared through a file, a TCP server fed garbage, and a frozen (SIGSTOPped) server.
"""

from __future__ import annotations

import datetime
import gc
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from typing import Callable, Iterator

import pytest
import torch.distributed as td

from rustdist._core import FileStore, HashStore, PrefixStore, Store, TCPStore
from rustdist._errors import DistNetworkError, DistStoreError

from harness import free_port

SECOND = datetime.timedelta(seconds=1)


def tcp_master(**kw: object) -> TCPStore:
    kw.setdefault("timeout", datetime.timedelta(seconds=30))
    return TCPStore("127.0.0.1", 0, is_master=True, **kw)  # type: ignore[arg-type]


def run_child(code: str, *args: str) -> subprocess.Popen[str]:
    """Starts `python -c code args...` with line-buffered text pipes."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def finish(child: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = child.communicate(timeout=timeout)
    assert child.returncode == 0, f"child failed ({child.returncode}):\n{out}\n{err}"
    return out


# ---------------------------------------------------------------------------------------------
# Every method of every store.

FACTORIES: dict[str, Callable[[str], Store]] = {
    "hash": lambda tmp: HashStore(),
    "file": lambda tmp: FileStore(os.path.join(tmp, "store")),
    "tcp": lambda tmp: tcp_master(),
    "prefix-hash": lambda tmp: PrefixStore("pfx", HashStore()),
    "prefix-tcp": lambda tmp: PrefixStore("pfx", tcp_master()),
    "prefix-torch": lambda tmp: PrefixStore("pfx", td.HashStore()),
}


@pytest.fixture(params=sorted(FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Store]:
    s = FACTORIES[request.param](str(tmp_path))
    yield s
    del s
    gc.collect()


@pytest.mark.timeout(60)
def test_every_method(store: Store) -> None:
    assert store.num_keys() == 0
    assert store.set("a", "1") is None
    assert store.get("a") == b"1"
    store.set("a", b"hello")
    assert store.get("a") == b"hello"
    store.set("ba", bytearray(b"\x00\xff"))
    assert store.get("ba") == b"\x00\xff"
    with pytest.raises(TypeError):
        store.set("bad", 3)  # type: ignore[arg-type]

    assert store.add("c", 5) == 5
    assert store.add("c", -7) == -2
    assert store.get("c") == b"-2"
    store.set("n", "40")
    assert store.add("n", 2) == 42

    store.append("a", " world")
    store.append("fresh", b"x")
    assert store.get("a") == b"hello world"
    assert store.get("fresh") == b"x"

    assert store.check(["a", "c"]) is True
    assert store.check(["a", "missing"]) is False

    assert store.compare_set("cs", "", "v1") == b"v1"  # absent + empty expected: set
    assert store.compare_set("cs2", "e", "v") == b"e"  # absent + other expected: untouched
    assert not store.check(["cs2"])
    assert store.compare_set("cs", "v1", b"v2") == b"v2"  # match: set
    assert store.compare_set("cs", "no", "v3") == b"v2"  # mismatch: current value
    assert store.get("cs") == b"v2"

    assert store.delete_key("cs") is True
    assert store.delete_key("cs") is False
    assert not store.check(["cs"])

    store.multi_set(["m1", "m2"], ["x", b""])
    assert store.multi_get(["m2", "m1"]) == [b"", b"x"]

    # a, ba, c, n, fresh, m1, m2
    assert store.num_keys() == 7
    store.wait(["a", "m1"])
    store.wait(["a"], SECOND)
    store.wait(["a"], 0.5)


@pytest.mark.timeout(60)
def test_add_on_non_integer_names_the_key(store: Store) -> None:
    store.set("word", "abc")
    with pytest.raises(DistStoreError, match="word") as info:
        store.add("word", 1)
    assert isinstance(info.value, td.DistStoreError)


@pytest.mark.timeout(60)
def test_timeouts(store: Store) -> None:
    assert isinstance(store.timeout, datetime.timedelta)
    store.set_timeout(datetime.timedelta(milliseconds=300))
    assert store.timeout == datetime.timedelta(milliseconds=300)
    t = time.monotonic()
    with pytest.raises(DistStoreError, match="nokey") as info:
        store.get("nokey")
    took = time.monotonic() - t
    assert 0.29 <= took < 5, took
    assert isinstance(info.value, td.DistStoreError)
    with pytest.raises(DistStoreError, match="gone"):
        store.multi_get(["gone"])
    store.set("here", "1")
    t = time.monotonic()
    with pytest.raises(DistStoreError, match="other"):
        store.wait(["here", "other"], datetime.timedelta(milliseconds=200))
    assert time.monotonic() - t < 5
    with pytest.raises(DistStoreError):
        store.wait(["other"], 0.1)  # float seconds
    store.set_timeout(2.5)
    assert store.timeout == datetime.timedelta(seconds=2.5)
    with pytest.raises(ValueError):
        store.set_timeout(-1.0)


@pytest.mark.timeout(60)
def test_blocked_get_releases_the_gil(store: Store) -> None:
    got: list[bytes] = []
    waiter = threading.Thread(target=lambda: got.append(store.get("later")))
    waiter.start()
    store.set("later", "v")  # runs only if the waiting thread released the GIL
    waiter.join(timeout=30)
    assert got == [b"v"]


# ---------------------------------------------------------------------------------------------
# Store-specific API.


@pytest.mark.timeout(60)
def test_tcp_store_properties_and_torch_signature() -> None:
    m = TCPStore(
        host_name="127.0.0.1",
        port=0,
        world_size=1,
        is_master=True,
        timeout=datetime.timedelta(seconds=10),
        wait_for_workers=True,
        multi_tenant=False,
        master_listen_fd=None,
        use_libuv=True,
    )
    assert m.host == "127.0.0.1"
    assert 0 < m.port < 65536
    assert m.timeout == datetime.timedelta(seconds=10)
    c = TCPStore("127.0.0.1", m.port, 2, False, 10.0)
    assert c.port == m.port
    c.set("k", "v")
    assert m.get("k") == b"v"
    assert isinstance(m, Store) and isinstance(c, Store)


@pytest.mark.timeout(60)
def test_tcp_client_without_server_is_network_error() -> None:
    port = free_port()
    t = time.monotonic()
    with pytest.raises(DistNetworkError, match=str(port)):
        TCPStore("127.0.0.1", port, timeout=datetime.timedelta(milliseconds=300))
    assert time.monotonic() - t < 5


@pytest.mark.timeout(60)
def test_tcp_master_restarts_on_same_port() -> None:
    m = tcp_master()
    port = m.port
    m.set("k", "v")
    del m
    gc.collect()
    m2 = TCPStore("127.0.0.1", port, is_master=True, timeout=SECOND)
    assert m2.port == port
    assert m2.num_keys() == 0


@pytest.mark.timeout(60)
def test_tcp_multi_tenant_shares_one_server() -> None:
    a = tcp_master(multi_tenant=True)
    b = TCPStore("127.0.0.1", a.port, is_master=True, multi_tenant=True)
    a.set("k", "shared")
    del a
    gc.collect()
    assert b.get("k") == b"shared"


@pytest.mark.timeout(60)
def test_file_store_path_and_cleanup(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "fs")
    a = FileStore(path, 2)
    b = FileStore(path, world_size=2)
    assert a.path == path
    a.set("k", "v")
    assert b.get("k") == b"v"
    del a
    gc.collect()
    assert os.path.exists(path)
    del b
    gc.collect()
    assert not os.path.exists(path)


@pytest.mark.timeout(60)
def test_prefix_store_namespaces_and_underlying() -> None:
    base = HashStore()
    p = PrefixStore("pg", base)
    assert p.underlying_store is base
    p.set("k", "v")
    assert base.get("pg/k") == b"v"
    assert not base.check(["k"])
    nested = PrefixStore("inner", p)
    nested.set("x", "1")
    assert base.get("pg/inner/x") == b"1"
    with pytest.raises(DistStoreError, match="pg/missing"):
        p.wait(["missing"], 0.1)
    with pytest.raises(TypeError):
        PrefixStore("p", object())  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_prefix_store_over_torch_tcp_store() -> None:
    t = td.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    p = PrefixStore("r", t)
    p.set("k", b"v")
    assert t.get("r/k") == b"v"
    assert p.add("ctr", 3) == 3
    assert p.compare_set("k", "v", "w") == b"w"
    assert p.multi_get(["k"]) == [b"w"]
    with pytest.raises(DistStoreError):
        p.wait(["nothing"], 0.2)


# ---------------------------------------------------------------------------------------------
# Several processes.

CHILD_TCP = """
    import sys, datetime
    from rustdist._core import TCPStore
    port = int(sys.argv[1])
    s = TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=30))
    s.set("from_child", "hi")
    assert s.get("from_parent") == b"hello"
    for _ in range(50):
        s.add("ctr", 1)
    s.set("child_done", "1")
    print("ok")
"""


@pytest.mark.timeout(120)
def test_tcp_store_shared_by_two_processes() -> None:
    m = tcp_master(wait_for_workers=False)
    child = run_child(CHILD_TCP, str(m.port))
    try:
        assert m.get("from_child") == b"hi"
        m.set("from_parent", "hello")
        for _ in range(50):
            m.add("ctr", 1)
        m.wait(["child_done"])
        assert m.add("ctr", 0) == 100
        assert finish(child).strip() == "ok"
    finally:
        child.kill()
        child.wait()


@pytest.mark.timeout(120)
def test_tcp_master_listen_fd_waits_for_workers() -> None:
    """The child starts first and retries until the master serves; the master's constructor
    returns once both stores (world_size=2) have connected."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    child = run_child(CHILD_TCP, str(port))
    try:
        m = TCPStore(
            "127.0.0.1",
            port,
            world_size=2,
            is_master=True,
            timeout=datetime.timedelta(seconds=60),
            master_listen_fd=sock.fileno(),
        )
        sock.close()  # the server owns its own duplicate
        assert m.port == port
        assert m.get("from_child") == b"hi"
        m.set("from_parent", "hello")
        m.add("ctr", 50)
        m.wait(["child_done"])
        assert m.add("ctr", 0) == 100
        assert finish(child).strip() == "ok"
    finally:
        child.kill()
        child.wait()


CHILD_FILE = """
    import sys
    from rustdist._core import FileStore
    s = FileStore(sys.argv[1])
    s.set("from_child", "hi")
    assert s.get("from_parent") == b"hello"
    for _ in range(100):
        s.add("ctr", 1)
    s.set("child_done", "1")
    print("ok")
"""


@pytest.mark.timeout(120)
def test_file_store_shared_by_two_processes(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "shared")
    s = FileStore(path)
    s.set_timeout(datetime.timedelta(seconds=30))
    child = run_child(CHILD_FILE, path)
    try:
        assert s.get("from_child") == b"hi"
        s.set("from_parent", "hello")
        for _ in range(100):
            s.add("ctr", 1)
        s.wait(["child_done"])
        assert s.add("ctr", 0) == 200
        assert finish(child).strip() == "ok"
    finally:
        child.kill()
        child.wait()


# ---------------------------------------------------------------------------------------------
# Hostile clients and a frozen server.


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(20)
    try:
        return sock.recv(16) == b""
    except ConnectionResetError:
        return True


@pytest.mark.timeout(120)
def test_tcp_server_survives_garbage() -> None:
    m = tcp_master()
    c = TCPStore("127.0.0.1", m.port, timeout=datetime.timedelta(seconds=10))
    c.set("before", "1")
    frames = [
        struct.pack("<IB", 1, 200),  # unknown opcode
        struct.pack("<I", 1 << 30),  # claims 1 GiB
        struct.pack("<IBI", 5, 2, 0xFFFF_FFFF),  # field longer than the frame
        os.urandom(4096),  # noise
    ]
    for frame in frames:
        with socket.create_connection(("127.0.0.1", m.port)) as s:
            s.sendall(frame)
            if frame is not frames[-1]:
                assert closed_by_server(s)
    # Half a frame, then hang up; and one claiming 200 MiB that stays open, sending nothing.
    with socket.create_connection(("127.0.0.1", m.port)) as s:
        s.sendall(struct.pack("<I", 100) + b"\x02\x01")
    stalled = socket.create_connection(("127.0.0.1", m.port))
    stalled.sendall(struct.pack("<I", 200 << 20) + b"\x02")
    try:
        for i in range(200):
            with socket.create_connection(("127.0.0.1", m.port)) as s:
                s.sendall(struct.pack("<IB", 1, 99))
                assert closed_by_server(s)
        t = time.monotonic()
        c.set("after", "2")
        assert m.get("after") == b"2"
        assert c.get("before") == b"1"
        fresh = TCPStore("127.0.0.1", m.port, timeout=datetime.timedelta(seconds=10))
        assert fresh.add("n", 1) == 1
        assert time.monotonic() - t < 2
    finally:
        stalled.close()


CHILD_SERVER = """
    import sys, datetime
    from rustdist._core import TCPStore
    m = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
    m.set("k0", "v0")
    print(m.port, flush=True)
    sys.stdin.read()  # serve until the parent closes stdin (or kills us)
"""


@pytest.mark.timeout(60)
def test_frozen_server_client_honours_timeout() -> None:
    child = run_child(CHILD_SERVER)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        c = TCPStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=10))
        assert c.get("k0") == b"v0"
        os.kill(child.pid, signal.SIGSTOP)
        try:
            c.set_timeout(SECOND)
            t = time.monotonic()
            with pytest.raises(DistStoreError, match="k1"):
                c.get("k1")
            assert time.monotonic() - t < 5
            t = time.monotonic()
            with pytest.raises(DistStoreError, match="k1"):
                c.wait(["k1"], datetime.timedelta(seconds=1))
            assert time.monotonic() - t < 5
        finally:
            os.kill(child.pid, signal.SIGCONT)
        # Thawed, the server answers again (the client reconnects).
        c.set_timeout(datetime.timedelta(seconds=10))
        assert c.get("k0") == b"v0"
    finally:
        child.kill()
        child.wait()
