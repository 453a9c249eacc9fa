"""The package's import structure: every subpackage imports on its own, and no two modules
import each other, directly or through others (imports inside functions included)."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pipeline"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports anywhere in its body (``pipeline.x.y`` names).

    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module, else ``pkg``
    (whose ``__init__`` runs). Imports under ``if TYPE_CHECKING:`` are for the type checker only and
    do not count; names a package exports lazily (``_LAZY``) are strings, not imports. Built once per process:
    the tests only read it.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        for node in _runtime_nodes(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                # the nearest enclosing package module that exists
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("pipeline"):
                    edges.add(target)
        graph[name] = edges
    return graph


def _runtime_nodes(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in ast.walk(child))
            continue
        yield node
        yield from _runtime_nodes(node)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_graph_sees_known_edges():
    graph = import_graph()
    assert "pipeline.volume" in graph["pipeline.cache"] or "pipeline.errors" in graph["pipeline.cache"]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_modules():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (move the shared piece into a lower module): " + "; ".join(" ↔ ".join(c) for c in cycles)


PACKAGES = sorted(_module_name(p.parent) for p in ROOT.rglob("__init__.py"))
# third-party libraries imported once in a parent process, which then forks one child per subpackage: the
# children see none of the package's own modules, so the order of its imports is tested as if alone
THIRD_PARTY = ("numpy", "scipy.ndimage", "torch", "monai", "pydicom", "SimpleITK", "pandas", "matplotlib.pyplot", "yaml")
#: the job (a name no module has: it starts with "=") that, instead of a subpackage, imports ``pipeline`` and then each module that defines one of its lazily
#: exported names (as ``from pipeline.x import y`` does), and reports whether each name is still its object
SHADOW_JOB = "=public-names"
_FORKER = """
import importlib, json, os, sys, traceback
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
assert not [m for m in sys.modules if m == "pipeline" or m.startswith("pipeline.")]

def public_names_are_their_objects():
    import pipeline
    modules = {}
    for name, module in pipeline._LAZY.items():
        modules[name] = importlib.import_module(module)  # the defining modules first
    return {name: getattr(pipeline, name) is getattr(m, name) for name, m in modules.items()}

out = {}
for job in sys.argv[1].split(","):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            if job.startswith("="):  # SHADOW_JOB: no module name starts with "="
                result = public_names_are_their_objects()
            else:
                m = importlib.import_module(job)
                [getattr(m, n) for n in getattr(m, "__all__", [])]
                result = None
            msg, code = json.dumps(result).encode(), 0
        except BaseException:
            msg, code = traceback.format_exc().encode()[-4000:], 1
        os.write(w, msg)
        os._exit(code)
    os.close(w)
    text = b"".join(iter(lambda: os.read(r, 65536), b"")).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    out[job] = [code, json.loads(text) if code == 0 else text]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, list]:
    """{job: [exit code, result or traceback]} of importing each subpackage (and its ``__all__``) in a fresh process,
    and of :data:`SHADOW_JOB` in another; one interpreter forks them all, after importing the third-party libraries."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORKER, ",".join([*PACKAGES, SHADOW_JOB]), *THIRD_PARTY],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT.parent,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("package", PACKAGES)
def test_each_subpackage_imports_alone(package, imported_alone):
    code, text = imported_alone[package]
    assert code == 0, f"import {package} alone failed:\n{text}"


def test_an_import_that_fails_alone_is_reported(tmp_path):
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg" / "__init__.py").write_text("from .a import x\n")
    (tmp_path / "brokenpkg" / "a.py").write_text("from . import b\nx = 1\n")
    (tmp_path / "brokenpkg" / "b.py").write_text("from .a import x\n")  # a cycle that breaks when a is imported first
    proc = subprocess.run(
        [sys.executable, "-c", _FORKER, "brokenpkg,json"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["json"] == [0, None]
    assert result["brokenpkg"][0] == 1 and "ImportError" in result["brokenpkg"][1]


def test_a_public_name_is_its_object_whatever_module_was_imported_first(imported_alone):
    """``import pipeline.show`` (or ``from pipeline.show import show``) before ``ctp.show(vol)`` made ``ctp.show`` the
    module of that name: "'module' object is not callable"."""
    code, same = imported_alone[SHADOW_JOB]
    assert code == 0, same
    assert same and [name for name, ok in same.items() if not ok] == []


#: Modules whose shared helpers have public names in the module whose job they are: the renderings' layout, planes
#: and nodule letters, the 3-D preview and show().
PUBLIC_HELPERS_ONLY = (
    "pipeline.display",
    "pipeline.reconstruction.letter_spots",
    "pipeline.reconstruction.preview",
    "pipeline.reconstruction.preview_raster",
    "pipeline.reconstruction.render",
    "pipeline.reconstruction.render_layout",
    "pipeline.reconstruction.render_nodules",
    "pipeline.reconstruction.render_planes",
)


def private_imports(name: str) -> list[str]:
    """The underscore-prefixed names module ``name`` imports from other modules of the package (``from .x import
    _y`` anywhere in its body): another module's private helper, which it may rename or drop."""
    modules = _modules()
    path = modules[name]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and _resolve(name, path.name == "__init__.py", node).startswith("pipeline"):
            out += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return out


@pytest.mark.parametrize("module", PUBLIC_HELPERS_ONLY)
def test_render_modules_share_only_public_helpers(module):
    assert not private_imports(module), f"{module} imports private helpers: {private_imports(module)}"
