"""The package's imports point down the layers, without cycles, and load lazily.

Layers, bottom to top: ``ops`` and ``passes``, ``tracing``, ``onnx`` and ``models``,
``inspect`` and the integrations with other libraries, the command line. Every import
counts, also those inside functions: a function-level import still makes the lower
layer depend on the higher one.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from collections.abc import Callable

import yobx

ROOT = pathlib.Path(yobx.__file__).parent

#: rank of each layer; a module may import its own layer and those below
LAYERS = {
    "yobx.torch.ops": 0,
    "yobx.torch.node_text": 0,
    "yobx.torch.chrome_trace": 0,
    "yobx.torch.tolerances": 0,
    "yobx.torch.frozen_gc": 0,
    "yobx.torch.pytree_paths": 0,
    "yobx.torch.quiet_logs": 0,
    "yobx.torch.bounded_cache": 0,
    "yobx.torch.fx_code": 0,
    "yobx.torch.stages": 0,
    "yobx.torch.passes": 0,
    "yobx.torch.tracing": 1,
    "yobx.torch.onnx": 2,
    "yobx.models": 2,
    "yobx.torch.inspect": 3,
    "yobx.integrations": 3,
    "yobx.cli": 4,
    "yobx.export_command": 4,
    "yobx.seq2seq_command": 4,
    "yobx.inspect_command": 4,
    "yobx.cli_support": 4,
    "yobx.__main__": 4,
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The package modules ``name`` imports (``from .x import y`` counts ``x`` and, when
    ``y`` is a submodule, ``x.y``)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(c for c in candidates if c in modules and c != name)
    # a package importing its own submodules is how packages re-export names
    return {t for t in found if not t.startswith(name + ".")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _rank(name: str) -> int | None:
    for prefix, rank in LAYERS.items():
        if name == prefix or name.startswith(prefix + "."):
            return rank
    return None


def test_every_module_belongs_to_a_layer():
    unplaced = [m for m in _modules() if _rank(m) is None and m not in ("yobx", "yobx.torch")]
    assert not unplaced, f"add these modules to a layer in LAYERS: {unplaced}"


def _upward(rank: Callable[[str], int | None]) -> list[str]:
    """The imports from a ranked module to a module of a higher rank."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in _graph().items()
        for target in targets
        if rank(source) is not None and rank(target) is not None and rank(target) > rank(source)
    )


def test_imports_point_down():
    upward = _upward(_rank)
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


#: the rooms of ``yobx.torch.tracing``, bottom to top (see its package docstring): the
#: modules every room names (errors, the dynamic-shape specs, the graph operators, the
#: node arguments), the process isolation, the shape rules, the symbolic dimensions,
#: the inputs and the constraints, the tracer itself, robust tracing
TRACING_ROOMS = {
    "errors": 0,
    "dynamic_shapes": 0,
    "graph_operators": 0,
    "node_arguments": 0,
    "isolation": 1,
    "shape_rules": 2,
    "symbolic": 3,
    "inputs": 4,
    "constraints": 4,
    "core": 5,
    "robust": 6,
}


def _room(name: str) -> str | None:
    prefix = "yobx.torch.tracing."
    return name[len(prefix) :].split(".")[0] if name.startswith(prefix) else None


def test_every_module_of_the_tracer_belongs_to_a_room():
    unplaced = [m for m in _modules() if _room(m) is not None and _room(m) not in TRACING_ROOMS]
    assert not unplaced, f"add these modules' room to TRACING_ROOMS: {unplaced}"


def test_the_tracer_imports_point_down_its_rooms():
    upward = _upward(lambda name: TRACING_ROOMS.get(_room(name) or ""))
    assert not upward, "imports pointing up the tracer's rooms:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_no_import_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles: {cycles}"


def test_passes_load_without_tracer_or_exporter():
    code = (
        "import sys, yobx.torch.passes; "
        "print(sorted(m for m in sys.modules if m.startswith(('yobx.torch.tracing', "
        "'yobx.torch.onnx', 'yobx.torch.inspect'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_importing_the_tracer_and_exporter_does_not_import_dynamo():
    # importing dynamo takes half a second; only a trace needs it (torch's ShapeEnv)
    code = (
        "import sys, yobx.torch.tracing, yobx.torch.onnx, yobx.models, yobx.cli; "
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stdout


def test_lazy_names_of_yobx_torch():
    import yobx.torch

    assert yobx.torch.CustomTracer.__name__ == "CustomTracer"
    assert callable(yobx.torch.to_onnx)
    assert set(yobx.torch.__all__) <= set(dir(yobx.torch))
