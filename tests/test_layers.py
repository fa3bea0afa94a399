"""fp8mp's folders are its layers: every import points down (or sideways within a layer, without circles). The
top-level modules are the api layer: they re-export and patch no other module. No file is over MAX_LINES lines."""
from __future__ import annotations

import ast
import pathlib

import pytest

import fp8mp

PACKAGE = pathlib.Path(fp8mp.__file__).parent
# Bottom up; the top-level modules (fp8mp/__init__.py and the short paths beside it: fp8mp/recipe.py, ...) are
# the api layer above them all, and only re-export.
LAYERS = ["_C", "utils", "ops", "optim", "scaling", "quantized", "functions", "memory", "parallel", "nn", "planning",
          "training", "integrations"]
API = len(LAYERS)
MAX_LINES = 400


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] not in LAYERS:  # fp8mp itself or a top-level module (fp8mp.recipe)
        return API
    return LAYERS.index(parts[1])


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


TOP_LEVEL = sorted(p for p in PACKAGE.glob("*.py"))


def test_every_module_is_in_a_layer():
    folders = {p.parent.relative_to(PACKAGE).parts[0] for p in SOURCES if p.parent != PACKAGE}
    assert folders <= set(LAYERS), f"folders of fp8mp that are no layer: {sorted(folders - set(LAYERS))}"
    for path in TOP_LEVEL:  # what is not in a layer's folder is the api: re-exports only
        assert layer_of(module_name(path)) == API, path


def layer_name(module: str) -> str:
    return LAYERS[layer_of(module)] if layer_of(module) < API else "api"


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_imports_point_down(name):
    upward = [dep for dep in GRAPH[name] if layer_of(dep) > layer_of(name)]
    assert not upward, f"{name} (layer {layer_name(name)}) imports upward: {upward}"


def reexport_only_problems(path: pathlib.Path) -> list[str]:
    """What in `path` is more than a docstring, imports and the `__all__` / `__version__` constants."""
    problems = []
    for index, node in enumerate(ast.parse(path.read_text()).body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        targets = [getattr(t, "id", None) for t in node.targets] if isinstance(node, ast.Assign) else []
        constant = targets and all(isinstance(n, (ast.Constant, ast.List, ast.Tuple, ast.Load)) for n in ast.walk(node.value))
        if targets in (["__all__"], ["__version__"]) and constant:
            continue
        problems.append(f"{path.name}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return problems


@pytest.mark.parametrize("path", TOP_LEVEL, ids=lambda p: p.name)
def test_top_level_modules_only_reexport(path):
    assert reexport_only_problems(path) == [], "the api layer re-exports what the layers define; nothing else"


def patching(path: pathlib.Path) -> list[str]:
    """Where `path` assigns or deletes an attribute or item of another object (another module's attribute,
    a sys.modules entry), calls setattr / delattr, or names sys at all."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr"):
            found.append(ast.unparse(node))
        elif isinstance(node, ast.alias) and node.name.split(".")[0] == "sys":
            found.append(f"import {node.name}")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            found.append(f"from sys import {', '.join(alias.name for alias in node.names)}")
    return found


@pytest.mark.parametrize("path", TOP_LEVEL, ids=lambda p: p.name)
def test_the_api_patches_no_module(path):
    assert patching(path) == [], f"{path.name} assigns attributes of other modules or touches sys.modules"


def test_the_checkers_catch_patching(tmp_path):
    bad = tmp_path / "__init__.py"
    bad.write_text('"""doc."""\nimport sys as _sys\nfrom fp8mp import optim\noptim.X = 1\n'
                   '_sys.modules["fp8mp.x"] = optim\nsetattr(optim, "Y", 2)\n')
    assert patching(bad) == ["import sys", "optim.X", "_sys.modules['fp8mp.x']", "setattr(optim, 'Y', 2)"]
    assert len(reexport_only_problems(bad)) == 3


def test_no_file_is_over_the_line_limit():
    lines = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in SOURCES}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert long == {}, f"files over {MAX_LINES} lines (split them by idea): {long}"


def device_only_branches(path: pathlib.Path) -> list[str]:
    """Tests of a tensor's device for CUDA in `path` (`t.is_cuda`, `t.device.type == "cuda"`): a branch only a CUDA
    tensor takes, which the CPU suite never runs."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "is_cuda":
            found.append(f"line {node.lineno}: .is_cuda")
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "type"
              and any(isinstance(c, ast.Constant) and c.value == "cuda" for c in node.comparators)):
            found.append(f"line {node.lineno}: .type == 'cuda'")
    return found


@pytest.mark.parametrize("path", [p for p in SOURCES if layer_of(module_name(p)) > LAYERS.index("ops")],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_layers_above_ops_take_no_device_only_branch(path):
    # (No "cuda" in these tests' names: conftest marks such tests as GPU tests.) Device choices live in fp8mp/ops (a kernel per device, a composite where one is missing), so every line
    # above runs in the CPU suite.
    assert device_only_branches(path) == [], f"{path.name}: a branch only CUDA tensors take; move it into fp8mp/ops"


def test_the_device_branch_checker_catches_one(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x):\n    if x.is_cuda:\n        return 1\n    return 2 if x.device.type == 'cuda' else 3\n")
    assert device_only_branches(bad) == ["line 2: .is_cuda", "line 4: .type == 'cuda'"]


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
    if not (PACKAGE / layer).is_dir():
        pytest.skip(f"fp8mp/{layer} holds no module yet")
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
    assert doc and "import" in doc.lower(), f"fp8mp/{layer}/__init__.py must open with what lives there and what it may import"


def test_the_checker_catches_an_upward_import(tmp_path):
    bad = tmp_path / "fp8mp" / "ops" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from fp8mp.nn.linear import Linear\n")
    assert layer_of("fp8mp.nn.linear") > layer_of("fp8mp.ops.bad")
    assert "fp8mp.nn.linear" in fp8mp_imports(bad)
