"""The import graphs of the two packages have no cycles (lazy imports inside functions included)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"inferfleet_runtime": ROOT / "runtime", "inferfleet_operator": ROOT / "operator"}


def module_files(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of a package (a package's own name for its __init__)."""
    base = PACKAGES[package]
    modules = {}
    for path in sorted((base / package).rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's own modules that one module imports, at any depth of its code."""
    return imports_in(name, path.read_text(), path.name == "__init__.py", modules)


def imports_in(name: str, text: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The package's own modules that the code `text` of module `name` imports."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    modules = module_files(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_has_no_import_cycle(package):
    graph = import_graph(package)
    assert cycles(graph) == []


def test_cycle_finder_sees_a_two_module_cycle_and_ignores_a_chain():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_resolve_relative_and_lazy_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import leaf\n")
    (package / "sub" / "leaf.py").write_text("def f():\n    from ..top import g\n")
    (package / "top.py").write_text("import pkg.sub.leaf\n")
    modules = {"pkg": package / "__init__.py", "pkg.sub": package / "sub" / "__init__.py"}
    modules |= {"pkg.sub.leaf": package / "sub" / "leaf.py", "pkg.top": package / "top.py"}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph["pkg.sub"] == {"pkg.sub.leaf"}
    assert graph["pkg.sub.leaf"] == {"pkg.top"}
    assert graph["pkg.top"] == {"pkg.sub.leaf"}
    assert cycles(graph) == [["pkg.sub.leaf", "pkg.top"]]


# The operator's layers, lowest first: a module may import its own layer and the layers below it, never one above.
OPERATOR_LAYERS = ("api", "plan", "kube", "controller", "router")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    def rank(module: str) -> int | None:
        parts = module.split(".")
        return OPERATOR_LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in OPERATOR_LAYERS else None

    found = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            if rank(module) is not None and rank(target) is not None and rank(target) > rank(module):
                found.append(f"{module} imports {target} (layer {OPERATOR_LAYERS[rank(target)]} is above it)")
    return found


def test_every_operator_module_lives_in_a_layer():
    loose = [m for m in module_files("inferfleet_operator") if m != "inferfleet_operator" and m.count(".") < 2]
    assert [m for m in loose if m.split(".")[1] not in OPERATOR_LAYERS] == []


def test_operator_layers_import_only_downwards():
    assert layer_violations(import_graph("inferfleet_operator")) == []


def test_layer_check_sees_an_upward_import():
    graph = {
        "inferfleet_operator.plan.planner": {"inferfleet_operator.api.types", "inferfleet_operator.controller.cache"},
        "inferfleet_operator.controller.cache": {"inferfleet_operator.plan.planner"},
    }
    assert layer_violations(graph) == [
        "inferfleet_operator.plan.planner imports inferfleet_operator.controller.cache (layer controller is above it)"
    ]


# The runtime's engine loop (inferfleet_runtime.engine) drives a runner through a protocol: loading it brings in
# no torch, no checkpoint reader, no kernel and no model code. The one lazy import it keeps is the factory
# LLMEngine.from_model_dir, which builds the paged runner on request.
ENGINE_LOOP_MAY_NOT_LOAD = ("torch", "triton", "safetensors", "gguf")
RUNTIME_LAYERS_BELOW_THE_ENGINE_LOOP_NEVER_NEEDED = ("checkpoints", "kernels", "layers", "models", "worker", "compiled")


def test_loading_the_engine_loop_imports_no_torch_checkpoint_reader_or_kernel():
    code = (
        "import sys\n"
        "from inferfleet_runtime.engine import LLMEngine, SamplingParams\n"
        "import inferfleet_runtime.engine.async_engine, inferfleet_runtime.engine.scheduler\n"
        f"bad = {ENGINE_LOOP_MAY_NOT_LOAD!r}\n"
        f"layers = {RUNTIME_LAYERS_BELOW_THE_ENGINE_LOOP_NEVER_NEEDED!r}\n"
        "found = [m for m in sys.modules if m.split('.')[0] in bad"
        " or (m.startswith('inferfleet_runtime.') and m.split('.')[1] in layers)]\n"
        "print(sorted(found))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def top_level_imports(package: str) -> dict[str, set[str]]:
    """Like import_graph, but only the imports a module runs when it is loaded (none inside functions or classes'
    methods, none under `if TYPE_CHECKING`)."""
    modules = module_files(package)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        body = [
            node
            for node in tree.body
            if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
            and isinstance(node, (ast.Import, ast.ImportFrom, ast.Try, ast.If))
        ]
        kept = ast.Module(body=body, type_ignores=[])
        graph[name] = imports_in(name, ast.unparse(kept), path.name == "__init__.py", modules)
    return graph


def engine_loop_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        if not module.startswith("inferfleet_runtime.engine"):
            continue
        for target in sorted(imported):
            parts = target.split(".")
            if len(parts) > 1 and parts[1] in RUNTIME_LAYERS_BELOW_THE_ENGINE_LOOP_NEVER_NEEDED:
                found.append(f"{module} imports {target} when loaded")
    return found


def test_engine_loop_modules_import_no_worker_checkpoint_kernel_or_model_when_loaded():
    assert engine_loop_violations(top_level_imports("inferfleet_runtime")) == []


def test_engine_loop_check_sees_a_kernel_import():
    graph = {"inferfleet_runtime.engine.scheduler": {"inferfleet_runtime.kernels.native"}}
    assert engine_loop_violations(graph) == [
        "inferfleet_runtime.engine.scheduler imports inferfleet_runtime.kernels.native when loaded"
    ]


def test_the_offline_api_is_exported_from_the_engine_package():
    import inferfleet_runtime.engine as engine

    assert {"LLMEngine", "SamplingParams"} <= set(engine.__all__)
