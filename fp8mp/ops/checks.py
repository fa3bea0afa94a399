"""The ops' argument checks in Python, for the fake kernels: the same checks, in the same order, with
the same exception types and messages as csrc/<family>/<family>_checks.cpp.

A fake kernel runs where the C++ checks never do: under torch.compile and FakeTensorMode, and eagerly
whenever one argument is on the meta device (the dispatcher then picks the Meta kernel, which is the
fake one, even if the other arguments are CPU tensors). Every `register_fake` in fp8mp/ops/ starts by
calling the check of its op here, so a call refused eagerly is refused the same way under
FakeTensor and torch.compile (tests/ops/test_fake_checks.py compares the messages;
tests/ops/test_checks_in_step.py that every check here meets its C++ twin, and back).

Messages print dtypes, shapes and devices as c10 does (Float, [2, 3], cuda:0). The errors are the
C++ ones (csrc/common/stable.h): RuntimeError for FP8MP_CHECK, and for FP8MP_CHECK_VALUE a
RuntimeError whose message starts with the ValueError tag, which the wrappers of fp8mp.ops turn
into ValueError (errors.py).
"""
from __future__ import annotations

import ctypes
import math
import warnings

import torch

from fp8mp.ops.errors import VALUE_ERROR_TAG
from fp8mp.ops.format import FP8_DTYPES, HIGH_PRECISION_DTYPES

__all__ = [
    "check_cast_to_fp8_args", "check_cast_from_fp8_args", "check_fp8_gemm_args", "check_norm_fwd_args",
    "check_norm_fwd_fp8_args", "check_norm_bwd_args", "check_update_amax_history_args", "check_no_overlap",
    "check_block_quantize_args", "check_block_quantize_transpose_args", "check_block_scaled_gemm_args",
    "check_norm_block_fp8_args",
]



def _c10_dtype_names() -> dict[torch.dtype, str]:
    """c10's name of each dtype (what `<<` prints in a TORCH_CHECK message): torch.float32 -> "Float"."""
    with warnings.catch_warnings():  # "ComplexHalf support is experimental"
        warnings.simplefilter("ignore")
        return {d: torch.empty(0, dtype=d).type().rsplit(".", 1)[-1].removesuffix("Tensor")
                for d in vars(torch).values() if isinstance(d, torch.dtype)}


_C10_NAMES = _c10_dtype_names()


def dtype_name(dtype: torch.dtype) -> str:
    return _C10_NAMES.get(dtype, str(dtype))


def sizes(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _require(condition, error: type, message) -> None:
    """torch._check (which also takes the symbolic conditions of dynamic shapes); `error` ValueError
    tags the message as the C++ FP8MP_CHECK_VALUE does."""
    torch._check(condition, lambda: VALUE_ERROR_TAG + message if error is ValueError else message)


# ------------------------------------------------------------------------ shared (common/op_checks.cpp)
def parse_format(fmt: str, op: str) -> str:
    lower = fmt.lower()
    _require(lower in FP8_DTYPES, ValueError, f"{op}: argument 'fmt' must be 'e4m3' or 'e5m2', got '{fmt}'")
    return lower


def _check_gemm_bias(bias, a, b, out_dtype, op: str) -> None:
    """The optional [N] bias of out = a @ b.T, added in out_dtype on a's device."""
    if bias is None:
        return
    _require(bias.dtype == out_dtype, RuntimeError,
             f"{op}: argument 'bias' must have dtype out_dtype = {dtype_name(out_dtype)}, got {dtype_name(bias.dtype)}")
    _require(bias.device == a.device, RuntimeError,
             f"{op}: argument 'bias' must be on the input's device {a.device}, got {bias.device}")
    _require(bias.dim() == 1 and bias.shape[0] == b.shape[0], ValueError,
             f"{op}: argument 'bias' must have shape [N] = [{b.shape[0]}], got shape {sizes(bias)}")



def format_of(t: torch.Tensor, op: str, arg: str) -> str:
    for fmt, dtype in FP8_DTYPES.items():
        if t.dtype == dtype:
            return fmt
    _require(False, RuntimeError, f"{op}: argument '{arg}' must be float8_e4m3fn or float8_e5m2, got {dtype_name(t.dtype)}")


def check_scalar_tensor(t: torch.Tensor, like: torch.Tensor, op: str, arg: str) -> None:
    _require(t.dtype == torch.float32, RuntimeError,
             f"{op}: argument '{arg}' must be a 1-element float32 tensor, got dtype {dtype_name(t.dtype)}")
    _require(t.numel() == 1, ValueError, f"{op}: argument '{arg}' must be a 1-element float32 tensor, got shape {sizes(t)}")
    _require(t.device == like.device, RuntimeError,
             f"{op}: argument '{arg}' must be on the input's device {like.device}, got {t.device}")


def check_high_precision_dtype(dtype: torch.dtype, op: str, arg: str) -> None:
    _require(dtype in HIGH_PRECISION_DTYPES, RuntimeError,
             f"{op}: argument '{arg}' must be float32, bfloat16 or float16, got {dtype_name(dtype)}")


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte of the storage that `t`'s elements can touch (all of it between its extremes)."""
    itemsize = t.element_size()
    low = sum(min(0, (n - 1) * s) for n, s in zip(t.shape, t.stride()))
    high = sum(max(0, (n - 1) * s) for n, s in zip(t.shape, t.stride()))
    start = (t.storage_offset() + low) * itemsize
    return start, (t.storage_offset() + high + 1) * itemsize


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when `a` and `b` view one storage and their spans of it intersect (empty tensors share nothing)."""
    if a.numel() == 0 or b.numel() == 0 or not torch._C._is_alias_of(a, b):
        return False
    (a_start, a_end), (b_start, b_end) = _byte_span(a), _byte_span(b)
    return a_start < b_end and b_start < a_end


def check_no_overlap(op: str, written: list[tuple[torch.Tensor, str]], read: list[tuple[torch.Tensor | None, str]]) -> None:
    """Each tensor the op writes in place shares no memory with any other argument (written or read)."""
    arguments = written + read
    for i, (out, out_name) in enumerate(written):
        for j, (other, other_name) in enumerate(arguments):
            if other is None or i == j:
                continue
            _require(not shares_memory(out, other), RuntimeError,
                     f"{op}: argument '{out_name}' is written in place and must not share memory with '{other_name}'")


# ------------------------------------------------------------------------ cast (cast/cast_checks.cpp)
def check_cast_to_fp8_args(x, scale, amax, fmt, op: str) -> str:
    """Returns the format ("e4m3" / "e5m2")."""
    fmt = parse_format(fmt, op)
    check_high_precision_dtype(x.dtype, op, "x")
    check_scalar_tensor(scale, x, op, "scale")
    check_scalar_tensor(amax, x, op, "amax")
    check_no_overlap(op, [(amax, "amax")], [(x, "x"), (scale, "scale")])
    return fmt


def check_cast_to_fp8_transpose_args(x, scale, amax, fmt, op: str = "fp8mp::cast_to_fp8_transpose") -> str:
    fmt = check_cast_to_fp8_args(x, scale, amax, fmt, op)
    _require(x.dim() == 2, ValueError, f"{op}: argument 'x' must be 2-D, got shape {sizes(x)}")
    return fmt


def check_cast_from_fp8_args(y, scale_inv, out_dtype) -> str:
    op = "fp8mp::cast_from_fp8"
    fmt = format_of(y, op, "y")
    check_scalar_tensor(scale_inv, y, op, "scale_inv")
    check_high_precision_dtype(out_dtype, op, "out_dtype")
    return fmt


# ------------------------------------------------------------------------ gemm (gemm/gemm_checks.cpp)
def check_fp8_gemm_args(a, a_scale_inv, b, b_scale_inv, bias, out_dtype) -> None:
    op = "fp8mp::fp8_gemm"
    formats = format_of(a, op, "a"), format_of(b, op, "b")
    _require(formats != ("e5m2", "e5m2"), RuntimeError,
             f"{op}: arguments 'a' and 'b' cannot both be float8_e5m2 (cuBLASLt has no e5m2 x e5m2 FP8 GEMM); "
             "make at least one of them float8_e4m3fn")
    _require(b.device == a.device, RuntimeError, f"{op}: argument 'b' must be on the device of 'a' {a.device}, got {b.device}")
    check_scalar_tensor(a_scale_inv, a, op, "a_scale_inv")
    check_scalar_tensor(b_scale_inv, a, op, "b_scale_inv")
    check_high_precision_dtype(out_dtype, op, "out_dtype")
    _require(a.dim() == 2, ValueError, f"{op}: argument 'a' must be 2-D [M, K], got shape {sizes(a)}")
    _require(b.dim() == 2, ValueError, f"{op}: argument 'b' must be 2-D [N, K], got shape {sizes(b)}")
    _require(b.shape[1] == a.shape[1], ValueError,
             f"{op}: argument 'b' must be [N, K] with K = a.size(1) = {a.shape[1]} (out = a @ b.T), got shape {sizes(b)}")
    _check_gemm_bias(bias, a, b, out_dtype, op)


# ------------------------------------------------------------------------ norm (norm/norm_checks.cpp)
def _check_norm_param(p, x, op: str, arg: str) -> None:
    hidden = x.shape[-1]
    _require(p.dim() == 1 and p.shape[0] == hidden, ValueError,
             f"{op}: argument '{arg}' must have shape [H] where H is x's last dimension: normalized_shape {sizes(p)} "
             f"vs x's last dimension {hidden} (x has shape {sizes(x)})")
    check_high_precision_dtype(p.dtype, op, arg)
    _require(p.device == x.device, RuntimeError, f"{op}: argument '{arg}' must be on the input's device {x.device}, got {p.device}")


def _check_norm_input(x, weight, op: str) -> None:
    check_high_precision_dtype(x.dtype, op, "x")
    _require(x.dim() >= 1 and x.shape[-1] > 0, ValueError,
             f"{op}: argument 'x' must have at least one dimension and a non-empty last dimension, got shape {sizes(x)}")
    if weight is not None:
        _check_norm_param(weight, x, op, "weight")


def check_norm_fwd_args(x, weight, bias, eps: float, op: str) -> None:
    _check_norm_input(x, weight, op)
    if bias is not None:
        _check_norm_param(bias, x, op, "bias")
        if weight is not None:
            _require(bias.dtype == weight.dtype, RuntimeError,
                     f"{op}: arguments 'weight' and 'bias' must have the same dtype, got {dtype_name(weight.dtype)} "
                     f"and {dtype_name(bias.dtype)}")
    eps_f = ctypes.c_float(eps).value  # the C++ check looks at static_cast<float>(eps)
    _require(math.isfinite(eps_f) and eps_f > 0.0, ValueError, f"{op}: argument 'eps' must be > 0 and finite (as a float32), got {eps:g}")


def check_norm_fwd_fp8_args(x, weight, bias, eps: float, scale, amax, fmt, op: str) -> str:
    check_norm_fwd_args(x, weight, bias, eps, op)
    fmt = check_cast_to_fp8_args(x, scale, amax, fmt, op)
    check_no_overlap(op, [(amax, "amax")], [(weight, "weight"), (bias, "bias")])
    return fmt


def check_norm_bwd_args(grad_out, x, mean, rstd, weight, op: str) -> None:
    _check_norm_input(x, weight, op)
    _require(tuple(grad_out.shape) == tuple(x.shape), ValueError,
             f"{op}: argument 'grad_out' must have x's shape {sizes(x)}, got {sizes(grad_out)}")
    _require(grad_out.dtype == x.dtype, RuntimeError,
             f"{op}: argument 'grad_out' must have x's dtype {dtype_name(x.dtype)}, got {dtype_name(grad_out.dtype)}")
    _require(grad_out.device == x.device, RuntimeError,
             f"{op}: argument 'grad_out' must be on the input's device {x.device}, got {grad_out.device}")
    stats_shape = tuple(x.shape[:-1])
    for t, arg in ((mean, "mean"), (rstd, "rstd")):
        if t is None:
            continue
        _require(t.dtype == torch.float32, RuntimeError, f"{op}: argument '{arg}' must be float32, got {dtype_name(t.dtype)}")
        _require(tuple(t.shape) == stats_shape, ValueError,
                 f"{op}: argument '{arg}' must have shape x.shape[:-1] = [{', '.join(map(str, stats_shape))}], got {sizes(t)}")
        _require(t.device == x.device, RuntimeError, f"{op}: argument '{arg}' must be on the input's device {x.device}, got {t.device}")


# ------------------------------------------------------------------------ scale update (scale_update/scale_update_checks.cpp)
def check_update_amax_history_args(amax, amax_history, scale, scale_inv, fp8_max, margin: int, amax_compute_algo: str) -> None:
    op = "fp8mp::update_amax_history_and_scale"
    args = [(amax, "amax"), (amax_history, "amax_history"), (scale, "scale"), (scale_inv, "scale_inv"), (fp8_max, "fp8_max")]
    for t, name in args:
        _require(t.dtype == torch.float32, RuntimeError, f"{op}: argument '{name}' must be float32, got {dtype_name(t.dtype)}")
        _require(t.layout == torch.strided, RuntimeError, f"{op}: argument '{name}' must be a strided tensor, got {t.layout}")
        _require(t.device == amax.device, RuntimeError, f"{op}: argument '{name}' must be on amax's device {amax.device}, got {t.device}")
    _require(amax.dim() == 1, ValueError, f"{op}: argument 'amax' must be 1-D [T], got shape {sizes(amax)}")
    num_tensors = amax.shape[0]
    _require(amax_history.dim() == 2 and amax_history.shape[0] >= 1 and amax_history.shape[1] == num_tensors, ValueError,
             f"{op}: argument 'amax_history' must have shape [H, T] with H >= 1 and T = amax.numel() = {num_tensors}, "
             f"got shape {sizes(amax_history)}")
    for t, name in args[2:]:
        _require(t.dim() == 1 and t.shape[0] == num_tensors, ValueError,
                 f"{op}: argument '{name}' must have shape [T] = [{num_tensors}] like amax, got shape {sizes(t)}")
    for t, name in args:
        _require(t.is_contiguous(), RuntimeError, f"{op}: argument '{name}' must be contiguous")
    for out in (1, 2, 3):  # the C++ order: each written tensor against every other argument
        for other in range(5):
            if other != out:
                _require(not shares_memory(args[out][0], args[other][0]), RuntimeError,
                         f"{op}: argument '{args[out][1]}' is written in place and must not share memory with "
                         f"'{args[other][1]}'")
    _require(margin >= 0, ValueError, f"{op}: argument 'margin' must be >= 0, got {margin}")
    _require(amax_compute_algo in ("max", "most_recent"), ValueError,
             f"{op}: argument 'amax_compute_algo' must be 'max' or 'most_recent', got '{amax_compute_algo}'")


# ------------------------------------------------------------------------ blockwise (blockwise/blockwise_checks.cpp)
BLOCK_SCALE_MODES = ("fp32", "pow2", "e8m0_floor", "e8m0_rceil")


def _ceil_div(a, b):
    return (a + b - 1) // b


def _check_block_size(size: int, op: str, arg: str) -> None:
    _require(size >= 1, ValueError, f"{op}: argument '{arg}' must be >= 1, got {size}")


def _check_quantize_input(x, fmt: str, scale_mode: str, op: str) -> tuple[str, str]:
    fmt = parse_format(fmt, op)
    _require(scale_mode in BLOCK_SCALE_MODES, ValueError,
             f"{op}: argument 'scale_mode' must be 'fp32', 'pow2', 'e8m0_floor' or 'e8m0_rceil', got '{scale_mode}'")
    check_high_precision_dtype(x.dtype, op, "x")
    _require(x.dim() == 2, ValueError, f"{op}: argument 'x' must be 2-D, got shape {sizes(x)}")
    return fmt, scale_mode


def check_block_quantize_args(x, block_rows: int, block_cols: int, fmt: str, scale_mode: str) -> tuple[str, str]:
    """Returns (format, scale_mode)."""
    op = "fp8mp::block_quantize"
    fmt, scale_mode = _check_quantize_input(x, fmt, scale_mode, op)
    _check_block_size(block_rows, op, "block_rows")
    _check_block_size(block_cols, op, "block_cols")
    return fmt, scale_mode


def check_block_quantize_transpose_args(x, row_block: int, col_block: int, fmt: str, scale_mode: str,
                                        op: str = "fp8mp::block_quantize_transpose") -> tuple[str, str]:
    """Returns (format, scale_mode)."""
    fmt, scale_mode = _check_quantize_input(x, fmt, scale_mode, op)
    _check_block_size(row_block, op, "row_block")
    _check_block_size(col_block, op, "col_block")
    return fmt, scale_mode


def check_norm_block_fp8_args(x, weight, bias, eps: float, is_layernorm: bool, row_block: int, col_block: int, fmt: str,
                              scale_mode: str) -> tuple[str, str]:
    """norm_fwd_block_fp8's checks (csrc/norm/norm_block_fp8_cpu.cpp); returns (format, scale_mode)."""
    op = "fp8mp::norm_fwd_block_fp8"
    _require(is_layernorm or bias is None, ValueError,
             f"{op}: argument 'bias' must be None for RMSNorm (is_layernorm=False)")
    check_norm_fwd_args(x, weight, bias, eps, op)
    return check_block_quantize_transpose_args(x, row_block, col_block, fmt, scale_mode, op)


def _check_block_scale(scale_inv, data, block_rows: int, block_k: int, op: str, arg: str) -> None:
    _require(scale_inv.dtype in (torch.float32, torch.float8_e8m0fnu), RuntimeError,
             f"{op}: argument '{arg}' must be float32 or float8_e8m0fnu, got {dtype_name(scale_inv.dtype)}")
    _require(scale_inv.device == data.device, RuntimeError,
             f"{op}: argument '{arg}' must be on the input's device {data.device}, got {scale_inv.device}")
    rows, cols = _ceil_div(data.shape[0], block_rows), _ceil_div(data.shape[1], block_k)
    _require(scale_inv.dim() == 2 and scale_inv.shape[0] == rows and scale_inv.shape[1] == cols, ValueError,
             f"{op}: argument '{arg}' must have shape [{rows}, {cols}] (one scale per {block_rows} x {block_k} block), "
             f"got shape {sizes(scale_inv)}")


def check_block_scaled_gemm_args(a, a_scale_inv, b, b_scale_inv, a_block_rows: int, b_block_rows: int, block_k: int,
                                 bias, out_dtype) -> None:
    op = "fp8mp::block_scaled_gemm"
    formats = format_of(a, op, "a"), format_of(b, op, "b")
    _require(formats != ("e5m2", "e5m2"), RuntimeError,
             f"{op}: arguments 'a' and 'b' cannot both be float8_e5m2 (FP8 tensor cores have no e5m2 x e5m2 GEMM); "
             "make at least one of them float8_e4m3fn")
    _require(b.device == a.device, RuntimeError, f"{op}: argument 'b' must be on the device of 'a' {a.device}, got {b.device}")
    check_high_precision_dtype(out_dtype, op, "out_dtype")
    _require(a.dim() == 2, ValueError, f"{op}: argument 'a' must be 2-D [M, K], got shape {sizes(a)}")
    _require(b.dim() == 2, ValueError, f"{op}: argument 'b' must be 2-D [N, K], got shape {sizes(b)}")
    _require(b.shape[1] == a.shape[1], ValueError,
             f"{op}: argument 'b' must be [N, K] with K = a.size(1) = {a.shape[1]} (out = a @ b.T), got shape {sizes(b)}")
    _check_block_size(a_block_rows, op, "a_block_rows")
    _check_block_size(b_block_rows, op, "b_block_rows")
    _check_block_size(block_k, op, "block_k")
    _check_block_scale(a_scale_inv, a, a_block_rows, block_k, op, "a_scale_inv")
    _check_block_scale(b_scale_inv, b, b_block_rows, block_k, op, "b_scale_inv")
    _check_gemm_bias(bias, a, b, out_dtype, op)
