"""fp8mp's folders are its layers: every import points down (or sideways within a layer, without circles)."""
from __future__ import annotations

import ast
import pathlib

import pytest

import fp8mp

PACKAGE = pathlib.Path(fp8mp.__file__).parent
# Bottom up; fp8mp/__init__.py (the public API) sits above them all.
LAYERS = ["_C", "ops", "optim", "scaling", "nn", "training", "integrations"]


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    parts = module.split(".")
    return len(LAYERS) if len(parts) == 1 else LAYERS.index(parts[1])


def fp8mp_imports(path: pathlib.Path) -> set[str]:
    """Every fp8mp module `path` imports, at module level or inside functions (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "fp8mp"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "fp8mp":
                continue
            for alias in node.names:  # `from fp8mp.x import y`: y may be a module or a name in x
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py"))
MODULES = {module_name(p): p for p in SOURCES} | {"fp8mp._C": None}
GRAPH = {name: fp8mp_imports(path) for name, path in MODULES.items() if path is not None}


def test_every_module_is_in_a_layer():
    for name in GRAPH:
        assert layer_of(name) >= 0, name
    assert {p.name for p in PACKAGE.iterdir() if p.suffix == ".py"} == {"__init__.py"}, "modules belong in a layer's folder"


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_imports_point_down(name):
    upward = [dep for dep in GRAPH[name] if layer_of(dep) > layer_of(name)]
    assert not upward, f"{name} (layer {LAYERS[layer_of(name)] if layer_of(name) < len(LAYERS) else 'api'}) imports upward: {upward}"


def test_no_module_imports_its_own_package():
    # A module in fp8mp/nn/ importing fp8mp.nn would run a half-initialized fp8mp/nn/__init__.py.
    for name, deps in GRAPH.items():
        assert not [d for d in deps if name.startswith(d + ".")], f"{name} imports its own package: {deps}"


def test_no_import_circles():
    edges = {name: {d for d in deps if d in GRAPH and d != name} for name, deps in GRAPH.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for dep in edges[node]:
            if state.get(dep) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(dep):] + [dep]))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


@pytest.mark.parametrize("layer", LAYERS[1:])
def test_each_layer_says_what_it_may_import(layer):
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
    assert doc and "import" in doc.lower(), f"fp8mp/{layer}/__init__.py must open with what lives there and what it may import"


def test_the_checker_catches_an_upward_import(tmp_path):
    bad = tmp_path / "fp8mp" / "ops" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from fp8mp.nn.linear import Linear\n")
    assert layer_of("fp8mp.nn.linear") > layer_of("fp8mp.ops.bad")
    assert "fp8mp.nn.linear" in fp8mp_imports(bad)
