"""The front page stays a front page, its quickstart runs, and the project's files speak of the project.

History (how and in which round something was done, which issue asked for it) lives in the git log; a
tracked file that narrates the work or cites an issue by number fails here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
MAX_README_LINES = 250
# Built from pieces so that this file does not match itself.
NARRATION = re.compile(r"\b" + "ses" + r"sions?\b", re.IGNORECASE)
ISSUE_NUMBER = re.compile(r"\b" + "iss" + r"ues?\s*#?\s*\d", re.IGNORECASE)
HASH_NUMBER = re.compile(r"(?<![\w/&#$])" + "#" + r"\d+\b")  # a number after a hash in prose; not after "owner/repo"
BINARY_SUFFIXES = (".png", ".jpg", ".so", ".whl", ".gz")

needs_checkout = pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".git")),
                                    reason="not a git checkout of fp8mp (a copy of tests/ only)")


def offending_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line that narrates the work or cites an issue number."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if NARRATION.search(line) or ISSUE_NUMBER.search(line) or HASH_NUMBER.search(line):
            found.append((number, line.strip()))
    return found


def quickstart_code() -> str:
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("## Quickstart"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("\n```", start)]


def test_the_patterns_catch_narration_and_spare_ordinary_words():
    bad = ["measured in the third " + "ses" + "sion", "Before " + "Iss" + "ue 17:", "fixes " + "iss" + "ue " + "#" + "3",
           "as asked in " + "#" + "12"]
    good = ["each thread issues all its loads", "#include <cstdint>", "#pragma once", "a candidate PyTorch issue",
            "see pytorch/pytorch" + "#" + "167288", "possession", "`$" + "#` arguments", "color '#1f77b4'"]
    assert [line for line in bad if not offending_lines(line)] == []
    assert [line for line in good if offending_lines(line)] == []


@needs_checkout
def test_no_tracked_file_narrates_the_work_or_cites_issue_numbers():
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    offending = []
    for name in listed:
        if name.endswith(BINARY_SUFFIXES):
            continue
        try:
            with open(os.path.join(REPO, name), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        offending += [f"{name}:{number}: {line}" for number, line in offending_lines(text)]
    assert offending == []


@needs_checkout
def test_the_readme_is_a_front_page():
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; the guide in docs/ takes the rest"


@needs_checkout
def test_the_readme_quickstart_runs():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", quickstart_code()], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    final = re.fullmatch(r"final loss (\S+), 2 FP8 layers\n", proc.stdout)
    assert final, proc.stdout
    # The MLP learns sin(x) in FP8: from about 0.45 (the untrained output's error) to well below it.
    assert float(final.group(1)) < 0.05, proc.stdout
