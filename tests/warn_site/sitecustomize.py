"""Loaded first by every Python process the tests start (conftest puts this folder on
PYTHONPATH): watches for warnings whose origin is rustdist (tests/warn_guard.py). Loaded by
path, as module ``warn_guard``, so that tests/ is not put ahead on every program's path."""

import importlib.util
import os
import sys

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "warn_guard.py")
_spec = importlib.util.spec_from_file_location("warn_guard", _path)
if _spec is not None and _spec.loader is not None:
    _guard = importlib.util.module_from_spec(_spec)
    sys.modules["warn_guard"] = _guard
    _spec.loader.exec_module(_guard)
    _guard.install()
