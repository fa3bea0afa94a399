"""What /proc/cpuinfo says of this CPU, for the tests of the CPU paths fp8mp picks (the vector level of its loops,
csrc/common/cpu_isa.h; the GEMM path, csrc/gemm/cpu_gemm_path.h): an independent reading of the features that
fp8mp's cpuid code reads."""
from __future__ import annotations

from pathlib import Path

ISA_LEVELS = ("avx512", "avx2", "baseline")
# The CPU features each level needs, as /proc/cpuinfo names them: x86-64-v4's AVX-512 part, x86-64-v3.
ISA_NEEDS = {"avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
             "avx2": {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"}, "baseline": set()}


def cpuinfo_value(key: str) -> str:
    """The value of the first /proc/cpuinfo line for `key` ("" where there is none)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(key):
            return line.split(":", 1)[1].strip()
    return ""


def cpu_flags() -> set[str]:
    return set(cpuinfo_value("flags").split())


def best_isa_level() -> str:
    """The best level of fp8mp's vector loops this CPU runs."""
    flags = cpu_flags()
    return next(level for level in ISA_LEVELS if ISA_NEEDS[level] <= flags)


def why_not(level: str) -> str | None:
    """None where this CPU runs `level`, else a skip reason naming the features it lacks."""
    missing = ISA_NEEDS[level] - cpu_flags()
    if not missing:
        return None
    return f"FP8MP_CPU_ISA={level} needs the CPU features {', '.join(sorted(ISA_NEEDS[level]))}; this CPU lacks " \
           f"{', '.join(sorted(missing))}"


def choice_in_a_fresh_process(variable: str, value: str, call: str) -> tuple[str, str]:
    """(what fp8mp.ops.`call`() returns, the warnings it gave) in a new process whose environment sets `variable`
    to `value` (fp8mp reads these once per process)."""
    import os
    import subprocess
    import sys

    code = ("import warnings, fp8mp\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            f"    chosen = fp8mp.ops.{call}()\n"
            "print(chosen, '|', '; '.join(str(w.message) for w in caught))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env[variable] = value
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True, timeout=300)
    chosen, message = done.stdout.strip().splitlines()[-1].split(" | ")
    return chosen, message
