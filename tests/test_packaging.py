"""Every third-party import of fp8mp is declared in pyproject.toml, and only the required ones are
needed to import it: optional extras (plots, Hugging Face) are imported lazily, with a message
that names the extra. (.ci/user_install.sh checks the same by installing into a fresh venv.)"""
from __future__ import annotations

import ast
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import tomllib

import fp8mp

PACKAGE = pathlib.Path(fp8mp.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return canonical(re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0))


def declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    required = {requirement_name(r) for r in project["dependencies"]}
    extras = {extra: {requirement_name(r) for r in reqs} for extra, reqs in project["optional-dependencies"].items()}
    return required, extras


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module name -> the fp8mp files importing it (module level or inside functions)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "fp8mp" and top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, set()).add(str(path.relative_to(PACKAGE.parent)))
    return found


def distributions_of(module: str) -> set[str]:
    return {canonical(d) for d in importlib.metadata.packages_distributions().get(module, [])}


def test_every_third_party_import_is_declared():
    required, extras = declared()
    optional = set().union(*extras.values())
    imports = third_party_imports()
    assert {"torch", "tqdm", "matplotlib", "transformers"} <= imports.keys()  # the walk sees what fp8mp imports
    undeclared = {m: sorted(files) for m, files in imports.items() if not distributions_of(m) & (required | optional)}
    assert not undeclared, f"imported by fp8mp but not declared in pyproject.toml: {undeclared}"


def test_fp8mp_imports_with_only_the_required_dependencies():
    required, extras = declared()
    optional_only = set().union(*extras.values()) - required
    blocked = sorted(m for m in third_party_imports() if distributions_of(m) and distributions_of(m) <= optional_only)
    assert {"matplotlib", "transformers", "safetensors"} <= set(blocked)
    script = textwrap.dedent(f"""
        import importlib, pkgutil, sys
        BLOCKED = {blocked!r} + ["lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "torchtitan", "trl"]

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)

        sys.meta_path.insert(0, Block())
        import fp8mp
        for info in pkgutil.walk_packages(fp8mp.__path__, "fp8mp."):
            if info.name not in ("fp8mp._C", "fp8mp._cuda_ops"):  # op libraries (torch.ops.load_library), not modules
                importlib.import_module(info.name)

        import torch
        model = fp8mp.convert(torch.nn.Sequential(torch.nn.Linear(16, 16)))
        monitor = fp8mp.monitor.attach(model)
        with fp8mp.fp8_autocast():
            model(torch.randn(4, 16)).sum().backward()
        monitor.record_step()
        def needs_extra(use, extra):
            try:
                use()
            except ImportError as error:
                assert f"pip install 'fp8mp[{{extra}}]'" in str(error), error
            else:
                raise AssertionError(f"{{use}} without the {{extra}} extra did not raise")

        needs_extra(lambda: monitor.plot("unused"), "plot")
        needs_extra(lambda: fp8mp.integrations.hf.from_pretrained(object, "."), "hf")
        needs_extra(lambda: fp8mp.integrations.lightning.FP8Precision, "lightning")
        needs_extra(lambda: fp8mp.integrations.torchtitan.fp8_linear, "torchtitan")
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_the_user_install_check_runs_in_make_test():
    makefile = (PACKAGE.parent / "Makefile").read_text()
    assert re.search(r"^TEST_STAGES :=.*\buser-install\b", makefile, re.M)
    # The user's path is the wheel; `make user-install-source` is the same with `pip install .`.
    assert re.search(r"^user-install: wheel\n\tFP8MP_WHEEL=.+ \.ci/user_install\.sh$", makefile, re.M)
    assert re.search(r"^user-install-source:\n\t\.ci/user_install\.sh$", makefile, re.M)
    script = (PACKAGE.parent / ".ci" / "user_install.sh").read_text()
    for step in ("-m venv", "install \"$TORCH_SPEC\"", "install .)", "install \"$FP8MP_WHEEL\"", "import fp8mp", "examples/quickstart.py",
                 "uninstall -y fp8mp"):
        assert step in script, step
    assert "--no-build-isolation" not in script


def test_every_folder_of_the_package_ships_in_the_wheel():
    # setup.py lists the packages as find_packages(include=["fp8mp", "fp8mp.*"]), which finds a folder only by its
    # __init__.py: a layer's folder without one would be left out of the wheel while the checkout still imports it.
    import setuptools

    setup_py = (PACKAGE.parent / "setup.py").read_text()
    assert 'packages=find_packages(include=["fp8mp", "fp8mp.*"])' in setup_py
    folders = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("*.py")}
    found = set(setuptools.find_packages(str(PACKAGE.parent), include=["fp8mp", "fp8mp.*"]))
    assert folders - found == set(), "folders of fp8mp holding modules but no __init__.py"
    assert {"fp8mp.utils", "fp8mp.memory", "fp8mp.parallel"} <= found
