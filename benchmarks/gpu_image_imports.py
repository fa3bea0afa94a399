"""A pytest plugin that lets a test run import only what the GPU check's machine is sure to hold.

    python -m pytest -p gpu_image_imports ...      # with benchmarks/ on PYTHONPATH (gpu_check.sh --dry-run)
    PYTHONPATH=benchmarks/gpu_image python ...      # any command and its child processes (its sitecustomize.py)

GPU_IMAGE_ALSO="matplotlib,..." adds distributions a step documents as carried to the GPU machine
(docs/gpu_check.md: matplotlib for the GPT step's report).

The lent GPU machine has torch and no network, and no torchao; what else it holds can change. fp8mp's
promise there is its own requirements: the runtime dependencies and the `test` extra of pyproject.toml
(torch, numpy, tqdm; pytest, hypothesis, ml_dtypes), each with what it requires in turn. Every other
third-party top-level module (torchao, transformers, safetensors, matplotlib, ...) raises
ModuleNotFoundError here, so a CUDA test file that imports one at module level fails to collect on this
machine, as it would there, and a test that imports one inside itself (pytest.importorskip) skips.
The standard library, fp8mp and every module not installed into a site-packages folder (the tests' helpers,
benchmarks, examples) stay importable.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import importlib.machinery
import importlib.metadata
import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALLED = {"site-packages", "dist-packages"}  # the folders third-party distributions are installed into


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str | None:
    """'numpy>=1.2; python_version < "3.13"' -> 'numpy'; None for a requirement of an extra only."""
    if re.search(r"""extra\s*==""", requirement):
        return None
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return _normalized(match.group(1)) if match else None


def promised_distributions(pyproject: str = os.path.join(ROOT, "pyproject.toml")) -> set[str]:
    """fp8mp's runtime dependencies and its `test` extra, closed over what each installed one requires."""
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    wanted = [_requirement_name(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    wanted += [_normalized(name) for name in os.environ.get("GPU_IMAGE_ALSO", "").split(",") if name.strip()]
    promised = {_normalized(project["name"])}  # fp8mp itself, where it is installed rather than built in place
    while wanted:
        name = wanted.pop()
        if name is None or name in promised:
            continue
        promised.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        wanted += [_requirement_name(r) for r in requires]
    return promised


class _Refuser(importlib.abc.MetaPathFinder):
    """Raises ModuleNotFoundError for a top-level third-party module no promised distribution provides."""

    def __init__(self, promised: set[str]):
        self.promised = promised
        self.providers = {module: {_normalized(d) for d in dists}
                          for module, dists in importlib.metadata.packages_distributions().items()}
        self.refused: set[str] = set()

    def allowed(self, name: str) -> bool:
        if name in sys.stdlib_module_names or name in sys.builtin_module_names:
            return True
        spec = importlib.machinery.PathFinder.find_spec(name)
        if spec is None:
            return True  # absent anyway: the import fails as it would without this plugin
        origin = spec.origin if spec.origin not in (None, "namespace") else next(iter(spec.submodule_search_locations or []), "")
        if not INSTALLED & set(os.path.abspath(origin).split(os.sep)):
            return True  # not an installed distribution: the standard library's folder, the repository, a test's own
        return bool(self.providers.get(name, set()) & self.promised)

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or self.allowed(fullname):  # submodules follow their top-level package
            return None
        self.refused.add(fullname)
        raise ModuleNotFoundError(f"No module named '{fullname}' (not among what the GPU check's machine is sure to "
                                  "hold: benchmarks/gpu_image_imports.py)", name=fullname)


_refuser = _Refuser(promised_distributions())
sys.meta_path.insert(0, _refuser)
_find_spec = importlib.util.find_spec


def _find_spec_of_the_gpu_image(name, package=None):
    """importlib.util.find_spec as on the GPU machine: None for a refused module (torch asks so whether pandas or
    dill exist, and imports them where they do)."""
    top = importlib.util.resolve_name(name, package).partition(".")[0]
    if top not in sys.modules and not _refuser.allowed(top):
        _refuser.refused.add(top)
        return None
    return _find_spec(name, package)


importlib.util.find_spec = _find_spec_of_the_gpu_image


def pytest_report_header(config):
    return f"gpu_image_imports: only {', '.join(sorted(_refuser.promised))} and the standard library are importable"


def pytest_terminal_summary(terminalreporter):
    if _refuser.refused:
        terminalreporter.write_line(f"gpu_image_imports: refused {', '.join(sorted(_refuser.refused))}")
