"""fp8_gemm's CPU paths (csrc/gemm/cpu_gemm_path.h): FP8 -> fp32 with an IEEE fp32 GEMM, and fp8mp's
AVX512-BF16 and AMX kernels (FP8 -> bf16 while packing). Each is forced in a
subprocess (the path is decided once per process) and checked against float64 products of
ml_dtypes-decoded operands: exactly where every order of additions gives the same fp32 sum, else
within the fp32 accumulation bound, and fp8mp's own kernels within the rigorous error bound of their
summation order; and the automatic choice follows the CPU's bf16 matrix units."""
from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from fp8mp.ops import cpu_gemm_path
from cpu_levels import choice_in_a_fresh_process, cpu_flags, cpuinfo_value
from gemm_reference import FP32_ACC_RTOL, summation_error_bound

WORKER = Path(__file__).with_name("gemm_path_worker.py")
ML = {"torch.float8_e4m3fn": ml_dtypes.float8_e4m3fn, "torch.float8_e5m2": ml_dtypes.float8_e5m2}


def tile_state_granted() -> bool:
    """Whether Linux grants this process the AMX tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)),
    asked as bf16_gemm_amx.cpp asks it; a sandbox may refuse the system call."""
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    return platform.machine() == "x86_64" and \
        ctypes.CDLL(None, use_errno=True).syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0


def expected_path(forced: str | None) -> str:
    """The path cpu_gemm_path.h's gemm_path() takes on this CPU, forced or not."""
    flags = cpu_flags()
    if forced == "fp32":
        return "fp32"
    if forced == "avx512bf16":
        return "avx512bf16" if "avx512_bf16" in flags else "fp32"
    # Linux lists amx_* only where the OS enables the tiles; a process must still be granted their state.
    amx = {"amx_bf16", "amx_tile", "avx512_bf16"} <= flags and tile_state_granted()
    if forced == "amx":
        return "amx" if amx else "fp32"
    if amx:
        return "amx"
    # Intel cores run vdpbf16ps at half the fp32 FMAs' rate: without AMX they take the fp32 path.
    return "avx512bf16" if "avx512_bf16" in flags and cpuinfo_value("vendor_id") != "GenuineIntel" else "fp32"


WHY_FP32 = {"avx512bf16": "this CPU has no AVX512-BF16",
            "amx": "this CPU has no AMX-BF16 tiles, or the OS does not grant this process their state"}


def forced_env(forced: str) -> dict:
    """The environment that forces `forced`: a path of FP8MP_CPU_GEMM, "+aten" / "+fp8mp" forcing the fp32
    path's GEMM onto aten::bmm.out / fp8mp's own (FP8MP_CPU_FP32_GEMM: the stable routes taken where MKL's
    sgemm_ or oneDNN's linear is missing or gives a wrong answer)."""
    path, _, fp32_gemm = forced.partition("+")
    env = dict(os.environ, FP8MP_CPU_GEMM=path, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("FP8MP_CPU_FP32_GEMM", None)
    env.pop("FP8MP_CPU_ISA", None)  # the paths this CPU runs at its best level
    if fp32_gemm:
        env["FP8MP_CPU_FP32_GEMM"] = fp32_gemm
    return env


@pytest.fixture(scope="module", params=["fp32", "fp32+aten", "fp32+fp8mp", "avx512bf16", "amx"])
def forced_run(request, tmp_path_factory):
    """(the path FP8MP_CPU_GEMM asked for, the worker's results in a process started with it)."""
    out = tmp_path_factory.mktemp("gemm_path") / f"{request.param}.pt"
    subprocess.run([sys.executable, str(WORKER), str(out)], env=forced_env(request.param), check=True, timeout=600)
    return request.param.partition("+")[0], torch.load(out) | {"forced": request.param}


@pytest.fixture(scope="module")
def forced(forced_run):
    """forced_run where the asked-for kernel ran; a skip where the process fell back to the fp32 path, whose
    results the fp32 case checks already (they would pass here as the kernel's, testing nothing of it)."""
    asked, results = forced_run
    if results["path"] != asked:
        pytest.skip(f"FP8MP_CPU_GEMM={asked}: {WHY_FP32[asked]}, so fp8_gemm ran the {results['path']} path")
    return forced_run


def decoded_f64(codes: torch.Tensor, dtype: str) -> np.ndarray:
    return codes.numpy().view(ML[dtype]).astype(np.float64)


def reference(case) -> tuple[np.ndarray, np.ndarray]:
    a_codes, a_dtype, b_codes, b_dtype, _ = case
    a, b = decoded_f64(a_codes, a_dtype), decoded_f64(b_codes, b_dtype)
    return a @ b.T, np.abs(a) @ np.abs(b).T


@pytest.fixture(scope="module")
def fp32_path_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemm_path") / "fp32_reference.pt"
    subprocess.run([sys.executable, str(WORKER), str(out)], env=forced_env("fp32"), check=True, timeout=600)
    return torch.load(out)


def test_the_forced_path_is_taken(forced_run):
    path, results = forced_run
    assert results["path"] == expected_path(path)


def has_bf16_units() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def expected_fp32_gemm_route() -> str:
    """The fp32 GEMM torch_fp32_matmul.h chooses here, where MKL's sgemm_ and oneDNN's linear answer right."""
    if (has_bf16_units() or cpuinfo_value("vendor_id") == "GenuineIntel") and torch.backends.mkl.is_available():
        return "mkl_sgemm"
    if has_bf16_units():
        return "fp8mp"
    return "onednn" if torch.backends.mkldnn.is_available() else "aten_bmm"


def test_the_fp32_gemm_route_is_the_forced_or_the_probed_one(forced_run):
    results = forced_run[1]
    forced_route = results["forced"].partition("+")[2]
    want = {"aten": "aten_bmm", "fp8mp": "fp8mp"}.get(forced_route) or expected_fp32_gemm_route()
    assert results["fp32_gemm"] == want


@pytest.mark.parametrize("name", ["integers", "all_max", "cancelling"])
def test_exact_where_every_order_agrees(forced, name):
    """Integers below 2^24, or multiples of 448^2 below 2^24 * 448^2: every partial sum is exact in fp32."""
    case = forced[1]["cases"][name]
    ref, _ = reference(case)
    np.testing.assert_array_equal(case[4].double().numpy(), ref)


@pytest.mark.parametrize("name", ["random_e4m3", "random_e4m3_e5m2", "long_k_random", "many_rows", "ragged", "ragged_large",
                                  "few_rows_split_columns", "large_output"])
def test_within_fp32_accumulation_bound(forced, name):
    case = forced[1]["cases"][name]
    ref, abs_sum = reference(case)
    err = np.abs(case[4].double().numpy() - ref)
    assert (err <= FP32_ACC_RTOL * abs_sum).all(), f"max error {err.max()!r}, bound {FP32_ACC_RTOL * abs_sum.max()!r}"


# The order in which each path of fp8mp's own sums the products (csrc/gemm/bf16_kernel_io_avx512.h, and
# torch_fp32_matmul.h's own fp32 GEMM): (k per chunk, pairs of k per instruction, Kahan's compensation above K).
# MKL's, oneDNN's and aten's fp32 GEMMs pick their order per CPU: they are held to the order-free bound above.
OWN_SUMMATION_ORDERS = {"amx": (512, True, 4096), "avx512bf16": (256, True, 4096), "fp32+fp8mp": (None, False, None)}


@pytest.mark.parametrize("name", ["random_e4m3", "random_e4m3_e5m2", "long_k_random", "many_rows", "ragged", "ragged_large",
                                  "few_rows_split_columns", "large_output"])
def test_within_the_error_bound_of_its_summation_order(forced, name):
    """fp8mp's own kernels sum the exact products in a known order (chunks of 512 k in the AMX kernel, 256 in the
    AVX512-BF16 one, summed from zero in k order a pair of k at a time, their sums added plainly up to K = 4096
    and with Kahan's compensation beyond; fp8mp's fp32 GEMM in k order): each element's error against float64 is
    within the rigorous bound of that order (gemm_reference.summation_error_bound), a bound that follows from
    fp32's rounding alone, the same on every CPU."""
    order = OWN_SUMMATION_ORDERS.get(forced[1]["forced"])
    if order is None:
        pytest.skip(f"{forced[1]['forced']}: a library's fp32 GEMM, whose summation order is its own per CPU; held "
                    "to the order-free bound (test_within_fp32_accumulation_bound)")
    a_codes, a_dtype, b_codes, b_dtype, out = forced[1]["cases"][name]
    a, b = decoded_f64(a_codes, a_dtype), decoded_f64(b_codes, b_dtype)
    chunk, pairs, plain_max_k = order
    k = a.shape[1]
    bound = summation_error_bound(a, b, chunk or max(k, 1), pairs, plain_max_k is not None and k > plain_max_k)
    err = np.abs(out.double().numpy() - a @ b.T)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"error {err[worst]!r} at {worst}, bound {bound[worst]!r}"


def test_epilogue_scales_adds_bias_and_rounds_once(forced):
    """out = out_dtype(sum * (a_scale_inv * b_scale_inv) + bias) in fp32, the sum being the same path's unscaled
    one: the epilogue bit for bit, fp32 and bf16 out, one row block and several."""
    from gemm_path_worker import EPILOGUE_SCALES

    results = forced[1]
    scale = torch.tensor(EPILOGUE_SCALES[0], dtype=torch.float32) * torch.tensor(EPILOGUE_SCALES[1], dtype=torch.float32)
    assert set(results["epilogues"]) == {(n, str(d)) for n in ("ragged_large", "many_rows")
                                         for d in (torch.float32, torch.bfloat16)}
    for (name, dtype), (bias, out) in results["epilogues"].items():
        expected = (results["cases"][name][4] * scale + bias.float()).to(bias.dtype)
        assert out.dtype == bias.dtype and torch.equal(out, expected), (name, dtype)


def test_the_same_bits_every_call(forced):
    """Each output element is written by one thread from one order of additions: repeated calls agree."""
    results = forced[1]
    for repeat in results["repeated"]:
        for name, out in results["plain"].items():
            assert torch.equal(repeat[name], out), name


@pytest.mark.parametrize("setting", ["under_autocast", "under_low_precision"])
def test_user_torch_state_changes_nothing(forced, setting):
    """fp8mp's CPU GEMMs give the same bits under the user's torch.autocast(cpu, bf16) or a lowered fp32
    matmul precision (both change torch's own fp32 matmul), and leave those settings as they were. A matmul
    called inside an op runs under the caller's autocast: block_scaled_gemm's K chunks once came back in bf16."""
    results = forced[1]
    if setting == "under_low_precision" and results["forced"].endswith("+aten") and has_bf16_units():
        pytest.skip("aten's fp32 GEMMs follow torch.backends.mkldnn.matmul.fp32_precision on a CPU with bf16 units: "
                    "fp8mp falls back to its own GEMM there, never to aten's")
    assert results[f"{setting.removeprefix('under_')}_state_kept"]
    for name, out in results["plain"].items():
        assert torch.equal(results[setting][name], out), name


def test_automatic_choice_follows_bf16_matrix_units():
    if os.environ.get("FP8MP_CPU_GEMM") or os.environ.get("FP8MP_CPU_ISA"):
        pytest.skip("FP8MP_CPU_GEMM or FP8MP_CPU_ISA set for this process")
    assert cpu_gemm_path() == expected_path(None)


def test_an_unknown_forced_path_warns_and_chooses_itself():
    path, message = choice_in_a_fresh_process("FP8MP_CPU_GEMM", "bf16", "cpu_gemm_path")
    assert path == expected_path(None)
    assert "FP8MP_CPU_GEMM='bf16' is not one of fp32, avx512bf16, amx" in message
