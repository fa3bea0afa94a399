"""fp8mp/ops/checks.py restates the C++ argument checks for the fake kernels (which run where the C++ ones
cannot: FakeTensor, torch.compile, symbolic shapes). These tests keep the two in step both ways:

* every check in checks.py is met by a bad call that runs through the C++ kernel and through the fake
  kernel (meta tensors, FakeTensorMode) with the same exception and message (the bad-call tables of
  tests/ops/test_fake_checks.py and tests/ops/test_blockwise.py, and the calls below);
* every argument check of csrc/ has a check in fp8mp/ops/ (checks.py, or the op family's own module for the
  families whose checks live beside their fakes: grouped_gemm.py, optim.py) whose message carries the same
  text, except the checks of tensor values (a scale's sign, the group offsets' order), which only a kernel
  that reads the data can make.
"""
from __future__ import annotations

import ast
import importlib.util
import pathlib
import re
import sys

import torch

from fp8mp.ops import checks
from opcheck_util import error_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
ops = torch.ops.fp8mp
E4M3 = torch.float8_e4m3fn


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_in_step_{name}", pathlib.Path(__file__).parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fp8(*shape, dev):
    return torch.ones(shape, device=dev).to(E4M3)


def _one(dev):
    return torch.ones(1, device=dev)


# The checks the other tables do not reach.
MORE_BAD_CALLS = {
    "gemm b 1-D": lambda d: ops.fp8_gemm(_fp8(4, 8, dev=d), _one(d), _fp8(8, dev=d), _one(d), None, torch.float32),
    "norm block bias with RMSNorm": lambda d: ops.norm_fwd_block_fp8(
        torch.ones(4, 8, device=d), None, torch.ones(8, device=d), 1e-5, False, False, 8, 4, "e4m3", "fp32"),
    "block gemm a 3-D": lambda d: ops.block_scaled_gemm(_fp8(2, 4, 8, dev=d), torch.ones(4, 1, device=d), _fp8(3, 8, dev=d),
                                                        torch.ones(3, 1, device=d), 1, 1, 8, None, torch.float32),
    "block gemm b 1-D": lambda d: ops.block_scaled_gemm(_fp8(4, 8, dev=d), torch.ones(4, 1, device=d), _fp8(8, dev=d),
                                                        torch.ones(1, 1, device=d), 1, 1, 8, None, torch.float32),
}


def all_bad_calls() -> dict:
    fake_checks, blockwise = _load("test_fake_checks"), _load("test_blockwise")
    return {**{f"fake_checks: {k}": v for k, v in fake_checks.BAD_CALLS.items()},
            **{f"fake_checks overlap: {k}": v[0] for k, v in fake_checks.OVERLAPS.items()},
            **{f"blockwise: {k}": v for k, v in blockwise.BAD_CALLS.items()},
            **MORE_BAD_CALLS}


def _require_sites() -> dict[int, ast.Call]:
    tree = ast.parse(pathlib.Path(checks.__file__).read_text())
    return {n.lineno: n for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_require"}


def _unreachable_on_cpu(site: ast.Call) -> bool:
    """A check no CPU-only call brings to both kernels: a device check needs tensors on two real devices (a
    meta tensor beside CPU ones dispatches to the fake kernel; test_fake_checks covers its message), and a
    layout check a non-strided tensor, which the dispatcher sends to a backend fp8mp registers nothing for."""
    return any(isinstance(n, ast.Attribute) and n.attr in ("device", "layout") for n in ast.walk(site.args[0]))


def test_every_python_check_is_met_by_a_bad_call_compared_with_the_cpp_check(monkeypatch):
    met: dict[int, str] = {}
    require = checks._require

    def recording(condition, error, message):
        if not condition:
            met.setdefault(sys._getframe(1).f_lineno, current)
        return require(condition, error, message)

    monkeypatch.setattr(checks, "_require", recording)
    differ = {}
    for current, call in all_bad_calls().items():
        eager, meta, fake = error_of(call, "cpu"), error_of(call, "meta"), error_of(call, "fake")
        if not (eager == meta == fake and "argument" in eager[1]):
            differ[current] = (eager, meta, fake)
    assert not differ, differ
    sites = _require_sites()
    unmet = sorted(line for line, site in sites.items() if line not in met and not _unreachable_on_cpu(site))
    assert not unmet, [f"fp8mp/ops/checks.py:{line}: {ast.unparse(sites[line])[:100]}" for line in unmet]


def _cpp_argument_checks() -> list[tuple[str, list[str]]]:
    """(file, the string literals of the message) of every FP8MP_CHECK / FP8MP_CHECK_VALUE in csrc/ whose
    message names an argument."""
    found = []
    for path in sorted((ROOT / "csrc").rglob("*.cpp")):
        text = path.read_text()
        for match in re.finditer(r"\bFP8MP_CHECK(?:_VALUE)?\(", text):
            i, depth, message_at = match.end(), 1, None
            while depth:
                if text[i] == '"':
                    i += 1
                    while text[i] != '"':
                        i += 2 if text[i] == "\\" else 1
                elif text[i] in "([{":
                    depth += 1
                elif text[i] in ")]}":
                    depth -= 1
                elif text[i] == "," and depth == 1 and message_at is None:
                    message_at = i + 1  # after the condition
                i += 1
            body = text[message_at: i - 1]
            # Adjacent literals ("a" "b") are one string in C++.
            literals = [bytes(s, "utf-8").decode("unicode_escape") for s in
                        re.findall(r'"((?:[^"\\]|\\.)*)"', re.sub(r'"\s*\n\s*"', "", body))]
            if any("argument" in s for s in literals):
                found.append((str(path.relative_to(ROOT)), literals))
    return found


# Checks of tensor values: a fake kernel sees shapes and dtypes only, so these have no Python twin.
VALUE_CHECKS = ("' must be finite and > 0, got ", "' must be non-decreasing and >= 0", "' must end at ",
                "' must have C = ")  # the last: block columns counted from offs' values


def _python_messages() -> list[str]:
    """Each _require message of fp8mp/ops/*.py with every {placeholder} as \\0."""
    messages = []
    sites = []
    for path in sorted(pathlib.Path(checks.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        sites += [n for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_require"]
    for site in sites:
        message = site.args[2]
        if isinstance(message, ast.JoinedStr):
            messages.append("".join(v.value if isinstance(v, ast.Constant) else "\0" for v in message.values))
        elif isinstance(message, ast.Constant):
            messages.append(message.value)
    return messages


def _carries(message: str, literals: list[str]) -> bool:
    at = 0
    for literal in literals:
        at = message.find(literal, at)
        if at < 0:
            return False
        at += len(literal)
    return True


def test_every_cpp_argument_check_has_a_python_twin_with_its_text():
    cpp = _cpp_argument_checks()
    assert len(cpp) > 40  # the parser found the checks
    python = _python_messages()
    missing = [(path, literals) for path, literals in cpp if not any(_carries(m, literals) for m in python)
               and not any(value_check in literal for literal in literals for value_check in VALUE_CHECKS)]
    assert not missing, missing


def test_the_twin_finder_catches_a_check_python_lacks():
    assert not any(_carries(m, [": argument '", "' must be a prime number, got "]) for m in _python_messages())
