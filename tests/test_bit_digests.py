"""benchmarks/bit_digests.py: the digests that prove a restructuring changed no bit are reproducible, tell the
configurations apart, and --compare fails on a difference, naming the configuration and the part."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bit_digests.py"
CONFIGS = "gpt_delayed,gpt_current,resume"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_digests_repeat_bit_for_bit_and_compare_catches_a_difference(tmp_path):
    first = tmp_path / "first.json"
    proc = run("--configs", CONFIGS, "--out", str(first))
    assert proc.returncode == 0, proc.stderr[-3000:]
    digests = json.loads(first.read_text())["digests"]
    assert set(digests) == set(CONFIGS.split(","))
    # Two recipes train to different bits: the digest sees what the recipe does.
    assert digests["gpt_delayed"]["all"] != digests["gpt_current"]["all"]
    assert digests["gpt_delayed"]["params"] != digests["gpt_current"]["params"]

    # A second run against a record with one part changed: the other configurations repeat bit for bit, and the
    # changed part is named.
    tampered = json.loads(first.read_text())
    tampered["digests"]["resume"]["optimizer"] = "0" * 16
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(tampered))
    proc = run("--configs", CONFIGS, "--compare", str(changed))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "resume: DIFFERS in optimizer" in proc.stdout
    assert "2 identical, 1 differ" in proc.stdout


def test_an_unknown_configuration_is_named():
    proc = run("--configs", "gpt_delayed,gpt_nvfp5")
    assert proc.returncode == 2
    assert "unknown ['gpt_nvfp5']" in proc.stderr
