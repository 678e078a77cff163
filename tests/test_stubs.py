"""The `_core.pyi` stubs describe exactly what the extension exports (a stub check mode)."""

import ast
import inspect
from pathlib import Path

import pytest

import rustdist
import rustdist._core as core

STUB = Path(rustdist.__file__).with_name("_core.pyi")


def _stub_api() -> dict[str, set[str]]:
    """Top-level names of the stub, each with its public members (classes) or an empty set."""
    tree = ast.parse(STUB.read_text())
    api: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            api[node.name] = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
            }
        elif isinstance(node, ast.FunctionDef):
            api[node.name] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            api[node.target.id] = set()
    return api


def _runtime_members(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


@pytest.mark.timeout(30)
def test_stub_names_match_the_extension() -> None:
    stub = _stub_api()
    runtime = {name for name in dir(core) if not name.startswith("_")} | {"__version__"}
    assert set(stub) == runtime, f"stub-only: {set(stub) - runtime}, extension-only: {runtime - set(stub)}"
    for name, members in stub.items():
        obj = getattr(core, name)
        if not isinstance(obj, type):
            continue
        # Stub classes list their own methods; inherited ones come from the base class stub.
        inherited = set().union(*(stub.get(b.__name__, set()) for b in obj.__mro__[1:]))
        own = _runtime_members(obj) - inherited
        assert members - _runtime_members(obj) == set(), f"{name}: stubbed but missing {members - _runtime_members(obj)}"
        assert own - members == set(), f"{name}: not in the stub: {own - members}"
