"""fastdiff's import graph reads top-down: no import cycles, and no layer imports a higher one.

Layers, low to high: core <- the accelerator families and the package's own ``__init__`` (the public facade,
core's names only) <- eval <- zoo (the reference models), tune and serving <- cli. Both checks read every module's source with ``ast`` and take its
module-level imports (class bodies, ``if``/``try`` blocks and ``if TYPE_CHECKING:`` blocks included: a type-only
import is an arrow too); imports inside functions run later, on demand (optional dependencies, the zoo's builders).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fastdiff"

# top-level subpackage ("" is fastdiff/__init__.py itself) -> layer; a module imports only its layer or lower
LAYERS = {
    "core": 0,
    **dict.fromkeys(("cache", "compress", "distill", "guidance", "parallel", "schedulers", "train", "xla"), 1),
    "eval": 2,
    "zoo": 3,  # the reference models: builders, training, their evaluators (registered by entry point)
    "tune": 3,
    "serving": 3,
    "": 1,  # the facade: core's public names only
    "cli": 4,
}

# (importer, imported) module-level imports that go up a layer, each with its reason; empty: none is left
ALLOWED: set[tuple[str, str]] = set()


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module in the package (a package is its __init__.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("fastdiff", *path.relative_to(PACKAGE).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _module_level(body: list[ast.stmt]):
    """The statements that run on import, and type-only imports: not function bodies."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _module_level(getattr(node, field, None) or [])


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The fastdiff modules ``name`` imports at module level (``from pkg import mod`` is an import of pkg.mod)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in _module_level(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    resolved = set()
    for target in targets:
        while target and target not in known:  # fastdiff.zoo.tiny.make_pipeline -> fastdiff.zoo.tiny
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer(module: str) -> int:
    return LAYERS[module.split(".")[1] if "." in module else ""]


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each back edge of a depth-first search (empty when the graph is acyclic)."""
    state, stack, cycles = {}, [], []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return cycles


def test_every_subpackage_has_a_layer():
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages <= set(LAYERS), f"place these in LAYERS: {sorted(subpackages - set(LAYERS))}"


def test_the_graph_is_read():
    edges = graph()
    assert "fastdiff.core.pipeline" in edges["fastdiff.eval.bench"]  # a plain from-import
    assert "fastdiff.zoo.tiny_base" in edges["fastdiff.zoo.tiny_flow"]  # a from-import of a module's names
    assert sum(map(len, edges.values())) > 150


def test_no_import_cycles():
    cycles = find_cycles(graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_module_imports_a_higher_layer():
    upward = {(a, b) for a, targets in graph().items() for b in targets if layer(b) > layer(a)}
    new = sorted(upward - ALLOWED)
    assert not new, "imports of a higher layer (move the shared code down):\n" + "\n".join(
        f"{a} (layer {layer(a)}) -> {b} (layer {layer(b)})" for a, b in new
    )
    assert not ALLOWED - upward, f"no longer needed in ALLOWED: {sorted(ALLOWED - upward)}"


def test_the_checks_catch_a_cycle_and_an_upward_import():
    edges = {"fastdiff.core.a": {"fastdiff.zoo.b"}, "fastdiff.zoo.b": {"fastdiff.core.a"}}
    assert find_cycles(edges) == [["fastdiff.core.a", "fastdiff.zoo.b", "fastdiff.core.a"]]
    assert layer("fastdiff.zoo.b") > layer("fastdiff.core.a") and layer("fastdiff") < layer("fastdiff.cli.main")


def test_importing_the_package_gives_the_library_only():
    """``import fastdiff`` loads nothing heavy (no torch: ``fastdiff --version`` is instant); its first name loads
    the core, not the zoo, the evaluation bench or any accelerator, and leaves the diffusers namespace alone (saved
    fastdiff pipelines load through ``fastdiff.load_pipeline``)."""
    code = (
        "import sys, fastdiff; "
        "print(sorted(m for m in sys.modules if m.startswith('fastdiff.')), 'torch' in sys.modules); "
        "import diffusers; fastdiff.FastPipeline; "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('fastdiff.')})); "
        "print([n for n in ('ClassConditionalPipeline', 'GMMPipeline', 'GMMFlowPipeline') if hasattr(diffusers, n)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-3:] == ["[] False", "['core']", "[]"]


def test_plugins_come_from_pyproject_and_sit_above_their_loaders(monkeypatch):
    """The registry loads the accelerator families and ``quality_for`` the evaluators by entry point, named in
    pyproject.toml only: each named module exists and sits above the layer that loads it (a plugin imports its
    loader, never the reverse); the installed metadata agrees, and a source tree without it reads pyproject."""
    from fastdiff.core import plugins

    known, text = modules(), (PACKAGE.parent / "pyproject.toml").read_text()
    for group, loader in (
        (plugins.ACCELERATORS, "fastdiff.core.registry"),
        (plugins.QUALITY, "fastdiff.eval"),
    ):
        names = plugins._pyproject_entries(text, group)
        assert names and set(names) <= set(known), (group, names)
        assert all(layer(name) > layer(loader) for name in names), (group, names)
        assert plugins.plugin_modules(group) == names, f"reinstall (pip install -e .): {group} differs"
        monkeypatch.setattr(plugins, "entry_points", lambda group: [])
        assert plugins.plugin_modules(group) == names
        monkeypatch.undo()
