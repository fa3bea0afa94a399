"""fp8_gemm references: float64 products of torch-decoded operands, and the fp32 accumulation bound."""
from __future__ import annotations
import hashlib

import torch
import fp8mp

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMAT_PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]
OUT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FP32_ACC_RTOL = 1e-5  # the CPU's fp32 accumulation-order error, relative to sum |a_mk * b_nk| (CUDA: tensor_core_bound)

# (M, K, N): aligned and not (K, N not multiples of 16 are padded on CUDA), M = 1, K = 1, K = 0, empty results.
SHAPES = [(1, 16, 16), (4, 7, 3), (33, 100, 17), (64, 128, 96), (128, 48, 256), (1, 1, 1), (3, 0, 5), (0, 16, 8), (7, 16, 0)]


def fp8_randn(shape, dtype, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def scalar(v, device="cpu"):
    return torch.tensor([v], dtype=torch.float32, device=device)


def reference_f64(a, a_scale_inv, b, b_scale_inv, bias):
    """Exact-ish result before the final rounding, and sum_k |a_mk b_nk| * scale (for the error bound)."""
    a64, b64 = a.cpu().to(torch.float32).double(), b.cpu().to(torch.float32).double()
    scale = float(a_scale_inv) * float(b_scale_inv)
    out = (a64 @ b64.t()) * scale
    abs_sum = (a64.abs() @ b64.abs().t()) * abs(scale)
    if bias is not None:
        out = out + bias.cpu().double()
        abs_sum = abs_sum + bias.cpu().double().abs()
    return out, abs_sum


def assert_close_to_reference(out, ref64, abs_sum, out_dtype, acc_rtol=FP32_ACC_RTOL):
    assert out.dtype == out_dtype and out.shape == ref64.shape and out.is_contiguous()
    info = torch.finfo(out_dtype)
    # One ulp of out_dtype at |ref| (eps * |ref| bounds it), the smallest step near zero, fp32 accumulation error.
    tol = info.eps * ref64.abs() + info.tiny * info.eps + acc_rtol * abs_sum
    err = (out.cpu().double() - ref64).abs()
    bad = (err > tol).nonzero()
    assert bad.numel() == 0, (
        f"{len(bad)} of {out.numel()} elements off, first at {tuple(bad[0].tolist())}: "
        f"got {out.cpu().double()[tuple(bad[0])].item()!r}, reference {ref64[tuple(bad[0])].item()!r}, "
        f"tolerance {tol[tuple(bad[0])].item()!r}"
    )


def run_and_check(a, b, a_scale_inv, b_scale_inv, bias, out_dtype, **kwargs):
    out = fp8mp.fp8_gemm(a, scalar(a_scale_inv, a.device), b, scalar(b_scale_inv, a.device), bias=bias,
                         out_dtype=out_dtype, **kwargs)
    ref64, abs_sum = reference_f64(a, a_scale_inv, b, b_scale_inv, bias)
    assert_close_to_reference(out, ref64, abs_sum, out_dtype)
    return out


UNIT_ROUNDOFF_FP32 = 2.0 ** -24


def summation_error_bound(a64, b64, chunk: int, pairs: bool, compensated: bool, rows_per_block: int = 0):
    """A rigorous bound on |fp32 result - exact| of each a @ b.T element summed in a known order: the exact
    (here float64) products of k in chunks of `chunk` consecutive k, each chunk summed from zero in k order, the
    chunks' sums then added in k order plainly or, `compensated`, with Kahan's compensation.

    Each fp32 addition rounds its result s to nearest with an error of at most u|s| (u = 2^-24); to first order
    the errors add, so a chunk errs by at most u * sum |s| over its running sums (Wilkinson's running error
    bound; the partial sums here are the exact ones, the computed ones differ from them by a relative O(Ku), covered
    by the (1 + 2Ku) factor below). `pairs`: the bf16 dot-product instructions (vdpbf16ps, AMX's tdpbf16ps) add the
    products of k = 2m and 2m + 1 to a lane in one instruction, whose intermediate sum may be either product's
    first: both running sums of each pair are counted. Plain chunk sums add u * sum |S_j| over the running sums S_j
    of the chunks' sums; Kahan's compensated sum errs by at most (2u + O(n u^2)) sum |C_j| (Higham, Accuracy and
    Stability of Numerical Algorithms, 2nd ed., (4.8)). The bound follows from the order alone, not from any
    library's result. a64: [M, K] float64, b64: [N, K]; returns [M, N] float64."""
    import numpy as np

    u = UNIT_ROUNDOFF_FP32
    m_rows, k = a64.shape
    n_cols = b64.shape[0]
    chunk = min(chunk, k + k % 2)  # one chunk, of whole pairs, where K fits in one: the bound is the same
    chunks = max(1, -(-k // chunk))
    padded = chunks * chunk
    a_pad = np.zeros((m_rows, padded)); a_pad[:, :k] = a64
    b_pad = np.zeros((n_cols, padded)); b_pad[:, :k] = b64
    rows_per_block = rows_per_block or max(1, (1 << 23) // max(1, n_cols * padded))
    bound = np.empty((m_rows, n_cols))
    for r0 in range(0, m_rows, rows_per_block):
        r1 = min(m_rows, r0 + rows_per_block)
        products = (a_pad[r0:r1, None, :] * b_pad[None, :, :]).reshape(r1 - r0, n_cols, chunks, chunk)
        running = np.cumsum(products, axis=-1)
        chunk_error = np.abs(running).sum(axis=(-1, -2))
        if pairs and chunk >= 2:
            before_pair = np.concatenate([np.zeros_like(running[..., :1]), running[..., 1:-1:2]], axis=-1)
            chunk_error += np.abs(before_pair + products[..., 1::2]).sum(axis=(-1, -2))
        chunk_sums = running[..., -1]
        if compensated:
            combine_error = (2 + 4 * chunks * u) * np.abs(chunk_sums).sum(axis=-1)
        else:
            combine_error = np.abs(np.cumsum(chunk_sums, axis=-1)[..., 1:]).sum(axis=-1)
        bound[r0:r1] = u * (chunk_error + combine_error) * (1 + 2 * k * u)
    return bound


# ---------------------------------------------------------------- the FP8 tensor cores' accumulation (CUDA)
# Hopper's FP8 tensor cores keep about 14 significant bits in the partial sums of an MMA before the result is
# promoted to fp32 (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.3.2: "limited to retaining around
# 14 bits"). One FP8 wgmma instruction takes K = 32 products (PTX ISA, wgmma.mma_async .e4m3/.e5m2, k32).
TENSOR_CORE_ACC_BITS = 14
TENSOR_CORE_MMA_K = 32
# DeepSeek-V3 (same section) measured a largest relative error near 2 % for K = 4096 with no promotion at all: an
# RMS error of 3 % of the result's RMS (30 dB) lies above that for any K the tests use, and below what a wrong
# kernel gives (one dropped 32-wide K slice of K = 2048 is 12 %, a wrong scale or layout about 100 %).
TENSOR_CORE_MIN_SQNR_DB = 30.0


def tensor_core_bound(a64, b64, promote_every: int | None = None):
    """A bound on |GPU result - exact| of each element of a64 @ b64.T computed by FP8 tensor cores, from their
    arithmetic: each MMA instruction adds its TENSOR_CORE_MMA_K exact products to the running accumulator with the
    terms aligned to the largest and cut to TENSOR_CORE_ACC_BITS significant bits, so each of its K + 1 terms
    (the accumulator included) loses less than one unit of 2^-(bits - 1) of the largest term's magnitude; a factor
    2 covers an instruction that adds in two halves (the accumulator cut twice) and rounding rather than cutting.
    The accumulator's magnitude is bounded by the exact partial sum plus the error bound so far (a recurrence,
    rigorous under the model). `promote_every`: the accumulator is moved into an fp32 register every that many
    k (a block-scaled GEMM's scale block: its scales are applied per block in fp32), each promotion an fp32
    addition that errs by at most 2^-24 of its result; None: never, as with fast accumulation, which also bounds
    cuBLASLt's default mode whatever its promotion interval. a64 [M, K], b64 [N, K] float64 (scales applied);
    returns [M, N] float64, the bound before the output's own rounding."""
    import numpy as np

    a = np.asarray(a64.double() if isinstance(a64, torch.Tensor) else a64, dtype=np.float64)
    b = np.asarray(b64.double() if isinstance(b64, torch.Tensor) else b64, dtype=np.float64)
    m_rows, k = a.shape
    n_cols = b.shape[0]
    unit = 2.0 ** -(TENSOR_CORE_ACC_BITS - 1)
    group = TENSOR_CORE_MMA_K
    interval = promote_every or max(k, 1)
    total_err, total = np.zeros((m_rows, n_cols)), np.zeros((m_rows, n_cols))
    for i0 in range(0, k, interval):
        err, acc = np.zeros((m_rows, n_cols)), np.zeros((m_rows, n_cols))
        for k0 in range(i0, min(i0 + interval, k), group):
            k1 = min(k0 + group, i0 + interval, k)
            products = a[:, None, k0:k1] * b[None, :, k0:k1]
            largest = np.maximum(np.abs(acc) + err, np.abs(products).max(axis=-1))
            err = err + 2 * (k1 - k0 + 1) * unit * largest
            acc = acc + products.sum(axis=-1)
        total = total + acc
        total_err = total_err + err + (2.0 ** -24 * (np.abs(total) + total_err + err) if promote_every else 0)
    return torch.from_numpy(total_err)


def assert_within_tensor_core_bound(out, ref64, bound, out_dtype, min_sqnr_db=TENSOR_CORE_MIN_SQNR_DB):
    """out (a CUDA FP8 GEMM's result) against the float64 reference: each element within `bound`
    (tensor_core_bound, plus bias terms if any) and one unit of out_dtype's rounding, and the whole within
    min_sqnr_db of it."""
    assert out.dtype == out_dtype and out.shape == ref64.shape
    info = torch.finfo(out_dtype)
    got = out.cpu().double()
    tol = bound + info.eps * (ref64.abs() + bound) + info.tiny * info.eps
    err = (got - ref64).abs()
    bad = (err > tol).nonzero()
    assert bad.numel() == 0, (
        f"{len(bad)} of {out.numel()} elements off, first at {tuple(bad[0].tolist())}: "
        f"got {got[tuple(bad[0])].item()!r}, reference {ref64[tuple(bad[0])].item()!r}, "
        f"tolerance {tol[tuple(bad[0])].item()!r}")
    if ref64.numel() and ref64.norm() > 0:
        sqnr = 20 * torch.log10(ref64.norm() / err.norm().clamp_min(1e-300))
        assert sqnr > min_sqnr_db, f"SQNR {sqnr.item():.1f} dB against the float64 reference"


_BOUNDS: dict = {}


def check_cuda_gemm(out, a, a_scale_inv, b, b_scale_inv, bias, out_dtype):
    """fp8_gemm's CUDA result against the float64 reference within the tensor cores' bound (bias added in fp32
    once: its own rounding is inside one unit of fp32)."""
    ref64, _ = reference_f64(a, a_scale_inv, b, b_scale_inv, bias)
    scale = float(a_scale_inv) * float(b_scale_inv)
    a, b = a.cpu().contiguous(), b.cpu().contiguous()
    key = (a.dtype, b.dtype, tuple(a.shape), tuple(b.shape), scale, hashlib.sha1(a.view(torch.uint8).numpy()).digest(),
           hashlib.sha1(b.view(torch.uint8).numpy()).digest())
    if key not in _BOUNDS:  # the same operands under several output types, biases and accumulation modes
        _BOUNDS[key] = tensor_core_bound(a.float().double() * scale, b.float().double())
    bound = _BOUNDS[key]
    if bias is not None:
        bound = bound + 2.0 ** -24 * (ref64.abs() + bound)
    assert_within_tensor_core_bound(out, ref64, bound, out_dtype)
