"""The fp32 path's GEMM (csrc/common/torch_fp32_matmul.h) uses MKL's sgemm_, found by name outside torch's
stable ABI, only after it gives the right answer on a small product: an sgemm_ that computes something
else is never used and fp8_gemm falls back to a stable route, still exact. The sgemm_ here is a
stand-in put first in the process's symbol lookup with LD_PRELOAD (built by the C compiler at test time)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_gemm_cpu_paths import cpu_flags, cpuinfo_value

# A column-major Fortran sgemm_ with 32-bit integers (MKL's LP64 interface), summing in fp32. WRONG=1 reads
# op(A) without its transpose: a GEMM that takes its arguments otherwise than MKL's.
SGEMM_SOURCE = r"""
#include <stdint.h>
void sgemm_(const char* ta, const char* tb, const int32_t* m, const int32_t* n, const int32_t* k, const float* alpha,
            const float* a, const int32_t* lda, const float* b, const int32_t* ldb, const float* beta, float* c,
            const int32_t* ldc) {
  const int transpose_a = (*ta == 'T' || *ta == 't') && !WRONG, transpose_b = *tb == 'T' || *tb == 't';
  for (int32_t j = 0; j < *n; ++j)
    for (int32_t i = 0; i < *m; ++i) {
      float s = 0.0f;
      for (int32_t p = 0; p < *k; ++p)
        s += (transpose_a ? a[p + i * *lda] : a[i + p * *lda]) * (transpose_b ? b[j + p * *ldb] : b[p + j * *ldb]);
      c[i + j * *ldc] = *alpha * s + (*beta == 0.0f ? 0.0f : *beta * c[i + j * *ldc]);
    }
}
"""

WORKER = r"""
import sys
import torch
import fp8mp
from gemm_path_worker import fp32_gemm_route
gen = torch.Generator().manual_seed(0)
a = torch.randint(-8, 9, (37, 300), generator=gen).float().to(torch.float8_e4m3fn)
b = torch.randint(-8, 9, (21, 300), generator=gen).float().to(torch.float8_e4m3fn)
one = torch.ones(1)
out = fp8mp.fp8_gemm(a, one, b, one, out_dtype=torch.float32)
exact = bool(torch.equal(out.double(), a.double() @ b.double().T))  # integers: every order of sums is exact
print(fp32_gemm_route(), exact)
"""

COMPILER = shutil.which("cc") or shutil.which("gcc")
uses_mkl_sgemm = ({"avx512_bf16", "amx_bf16"} & cpu_flags() or cpuinfo_value("vendor_id") == "GenuineIntel")
pytestmark = [pytest.mark.skipif(COMPILER is None, reason="needs a C compiler for the stand-in sgemm_"),
              pytest.mark.skipif(not uses_mkl_sgemm, reason="this CPU's fp32 path does not look for MKL's sgemm_ "
                                                            "(neither Intel nor with bf16 matrix units)")]


def run_with_sgemm(tmp_path: Path, wrong: bool) -> tuple[str, bool]:
    source, library = tmp_path / "sgemm.c", tmp_path / "sgemm.so"
    source.write_text(SGEMM_SOURCE)
    subprocess.run([COMPILER, "-shared", "-fPIC", "-O1", f"-DWRONG={int(wrong)}", str(source), "-o", str(library)],
                   check=True)
    env = dict(os.environ, LD_PRELOAD=str(library), FP8MP_CPU_GEMM="fp32",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    env.pop("FP8MP_CPU_FP32_GEMM", None)
    done = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=300,
                          check=True)
    route, exact = done.stdout.split()
    return route, exact == "True"


def test_an_sgemm_that_answers_right_is_used(tmp_path):
    assert run_with_sgemm(tmp_path, wrong=False) == ("mkl_sgemm", True)


def test_an_sgemm_that_answers_wrong_is_not_used_and_the_product_stays_exact(tmp_path):
    route, exact = run_with_sgemm(tmp_path, wrong=True)
    # With bf16 units fp8mp's own GEMM (torch's would follow a lowered fp32 matmul precision), else a torch one.
    assert route == ("fp8mp" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "onednn") and exact
