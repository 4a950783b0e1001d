"""The maintainers' tools (tools/*.py) as modules, for the tests that exercise them: ``from tools_path import
release``. They are scripts, not part of the package a student opens."""

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _load(name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


release = _load("release")
student_edition = _load("student_edition")
