"""Import a script of ``scripts/`` as a module (the scripts import their sibling scripts by name)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def import_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` loaded as module ``name``, with ``scripts/`` on ``sys.path`` while it loads."""
    path = SCRIPTS / f"{name}.py"
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPTS))
