"""benchmarks/gpu_check.sh: the GPU check's plan, its test collection and its benchmark commands, here.

`--dry-run` installs nothing and needs no GPU: it prints the plan (each step's limit, their sum within the
budget), collects every CUDA test file as the GPU run runs it with what the GPU machine may lack made
unimportable (benchmarks/gpu_image_imports.py), and runs each benchmark step's command on the CPU at tiny
sizes. The GPU run is the same script without --dry-run (docs/gpu_check.md).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
DOC = ROOT / "docs" / "gpu_check.md"
BUDGET_S = 520  # of the 600 s a device command may run: start-up, the last step's kill and the copy-back fit in the rest
FIGURES = ["gemm", "gemm_fast_accum", "cast_transpose", "linear", "block_scaling", "gpt", "weight_memory",
           "training_step_peak_memory", "train_memory"]


def plan() -> list[tuple[str, int]]:
    """The script's PLAN: (step, limit in seconds), in order."""
    block = re.search(r"^PLAN=\(\n(.*?)^\)", SCRIPT.read_text(), re.S | re.M).group(1)
    return [(name, int(limit)) for name, limit in re.findall(r'^\s*"(\S+) (\d+)"', block, re.M)]


def run_script(out_dir: pathlib.Path, timeout_s: int, **env) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(out_dir), PYTHON=sys.executable, **env)
    env.pop("FP8MP_TEST_TIMEOUT", None)
    return subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def test_the_plan_fits_one_device_command():
    steps = plan()
    names = [name for name, _ in steps]
    assert names[:2] == ["install", "environment"]
    assert sum(limit for _, limit in steps) <= BUDGET_S
    assert re.search(r"^PLAN_BUDGET_S=\$\{GPU_CHECK_PLAN_BUDGET_S:-520\}", SCRIPT.read_text(), re.M)
    tests = [name for name in names if name.startswith("test:")]
    assert tests and all((ROOT / name[len("test:"):]).is_file() for name in tests)
    assert {f"bench_{b}" for b in ("gemm", "cast_transpose", "linear", "block_scaling")} | {"gpt_loss_check",
                                                                                            "peak_memory",
                                                                                            "train_memory"} <= set(names)


def test_the_dry_run_passes_and_keeps_to_one_log_and_one_json(tmp_path):
    result = run_script(tmp_path, timeout_s=1500)
    log = (tmp_path / "gpu_check.log").read_text()
    assert result.returncode == 0, log[-6000:]
    assert "all steps passed" in log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.log"]
    total = int(re.search(r"sum of the limits\s+(\d+)s \(at most 520s\)", log).group(1))
    assert total == sum(limit for _, limit in plan()) <= BUDGET_S
    for name, limit in plan():  # the plan printed with each step's limit, then each step's output in the log
        assert re.search(rf"^  {re.escape(name)}\s+{limit}s$", log, re.M), name
        assert f"=== {name} (t=" in log and f"--- {name}: rc=0" in log, name
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [s["step"] for s in figures["steps"]] == [name for name, _ in plan()]
    assert all(s["rc"] == 0 for s in figures["steps"])
    assert figures["plan"] == [{"step": name, "limit_s": limit} for name, limit in plan()]
    for key in FIGURES:  # every benchmark wrote its rows
        assert figures[key], key
    # Each CUDA test file collected under the GPU machine's imports as many tests as with every package here.
    counts = dict(re.findall(r"^  (tests/\S+)\s+(\d+) tests, limit", log, re.M))
    assert set(counts) == {name[len("test:"):] for name, _ in plan() if name.startswith("test:")}
    for file, count in counts.items():
        assert re.search(rf"^{re.escape(file)}: {count}$", log, re.M), file
    assert sum(map(int, counts.values())) > 500
    assert {r["run"] for r in figures["gpt"]} == {"FP8", "BF16", "FP32"}


def test_a_plan_over_its_budget_fails_before_any_step(tmp_path):
    result = run_script(tmp_path, timeout_s=120, GPU_CHECK_PLAN_BUDGET_S="100")
    log = (tmp_path / "gpu_check.log").read_text()
    assert result.returncode != 0
    assert re.search(r"PLAN OVER BUDGET: the limits sum to \d+s, more than 100s", log)
    assert "=== install" not in log


def collect_under_the_gpu_image(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]),
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "gpu_image_imports", "-p", "no:cacheprovider",
                           "-q", "--rootdir", str(tmp_path), *args, str(tmp_path / "test_probe.py")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module", ["torchao", "transformers", "safetensors"])
def test_the_gpu_image_refuses_a_module_level_import_of_what_the_gpu_may_lack(tmp_path, module):
    pytest.importorskip(module)  # installed here: the refusal is the plugin's, not the environment's
    result = collect_under_the_gpu_image(tmp_path, f"import {module}\n\ndef test_probe_cuda():\n    pass\n",
                                         "--collect-only")
    assert result.returncode != 0
    assert f"No module named '{module}' (not among what the GPU check's machine is sure to hold" in result.stdout


def test_the_gpu_image_skips_a_test_that_imports_it_inside_and_keeps_what_fp8mp_promises(tmp_path):
    source = ("import hypothesis, ml_dtypes, numpy, pytest, torch, tqdm\nimport fp8mp\n\n"
              "def test_needs_torchao():\n    pytest.importorskip('torchao')\n\n"
              "def test_runs():\n    assert fp8mp.__version__\n")
    result = collect_under_the_gpu_image(tmp_path, source, "-rs")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 passed, 1 skipped" in result.stdout
    # Other installed packages' optional imports may be refused too (torch looks for dill where datasets brought
    # it): the plugin lists every refused module, sorted, on one line.
    refused = re.search(r"^gpu_image_imports: refused (.+)$", result.stdout, re.M)
    assert refused is not None and "torchao" in refused.group(1).split(", "), result.stdout[-3000:]


@pytest.mark.skipif(not DOC.exists(), reason="needs the source tree's docs/ (the wheel's test runs copy tests/ alone)")
def test_the_docs_give_each_step_its_limit():
    text = DOC.read_text()
    documented = dict(re.findall(r"^\| `([^`]+)` \| (\d+) s \|", text, re.M))
    assert {name: str(limit) for name, limit in plan()} == documented
    assert f"the limits sum to {sum(limit for _, limit in plan())} s" in text
    assert "make gpu-wheel" in text and "--dry-run" in text
