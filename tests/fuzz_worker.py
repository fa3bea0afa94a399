"""Property-based fuzz of every fp8mp op and of the modules, run in a subprocess by tests/test_fuzz.py.

    FP8MP_FUZZ_SEED=1234 python tests/fuzz_worker.py EXAMPLES_PER_TARGET [TARGET ...]   (seed: random unless given;
                                                                                      targets: all unless named)
    python tests/fuzz_worker.py --list        (each target and the schema ops it calls)

The seed is printed first; the same seed and the same number of examples replay the same inputs.

Random shapes (empty ones included), layouts (contiguous, transposed, huge-stride and stride-0
views), dtypes, the meta device, and values with NaN, +-Inf, subnormals and +-0. At most one
argument of a call is made bad on purpose (wrong dtype, shape or device, a bad format string, an
amax overlapping the input it is computed from). Every
call must either return what an independent reference returns (torch's own float8 casts, float64
matmuls and norms, the paper's scaling rule) or, exactly when an argument was made bad, raise a
RuntimeError / ValueError / TypeError whose message names that argument.

Before each call the worker prints it ("CALL ..." with every tensor's dtype, shape, strides and
values), flushed: if the process crashes, the last such line is the input that crashed it.
"""
from __future__ import annotations

import math
import os
import random
import sys

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fp8mp  # noqa: E402
from blockwise_reference import block_gemm_reference, deepseek_quantize  # noqa: E402
from fp8_reference import FP8_DTYPES, FP8_MAX, dbias_reference, is_nan_code, saturate  # noqa: E402

ops = torch.ops.fp8mp
HIGH = [torch.float32, torch.bfloat16, torch.float16]
BAD_DTYPES = [torch.float64, torch.int32, torch.float8_e4m3fn]
# The (a, b) formats the FP8 GEMMs take: every pair but E5M2 x E5M2, which cuBLASLt lacks.
GEMM_FORMAT_PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]
SPECIALS = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-40, -1e-45, 6e-8, 448.0, 464.0, 57344.0, 1e30, -3.4e38]


# ----------------------------------------------------------------------------- inputs
def describe(value) -> str:
    if isinstance(value, torch.Tensor):
        head = f"{value.dtype}{list(value.shape)} strides {list(value.stride())} on {value.device}"
        if value.device.type == "meta":
            return head
        shown = value.view(torch.uint8) if value.dtype in FP8_DTYPES.values() else value
        return f"{head} = {shown.tolist()}"
    return repr(value)


@st.composite
def floats_tensor(draw, shape, dtype, finite_max=None):
    """A tensor of `shape` (contiguous) with values from a pool of specials and random floats."""
    n = math.prod(shape)
    pool = st.one_of(st.sampled_from(SPECIALS if finite_max is None else [0.0, -0.0, 1e-40, 1.0, -2.5]),
                     st.floats(width=32, allow_nan=finite_max is None, allow_infinity=finite_max is None,
                               min_value=None if finite_max is None else -finite_max,
                               max_value=None if finite_max is None else finite_max))
    values = draw(st.lists(pool, min_size=n, max_size=n))
    return torch.tensor(values, dtype=torch.float32).reshape(shape).to(dtype)


@st.composite
def laid_out(draw, tensor):
    """`tensor`'s values in a contiguous, transposed, huge-stride or stride-0 view."""
    layout = draw(st.sampled_from(["contiguous", "transposed", "huge_stride", "expanded"]))
    if layout == "transposed" and tensor.dim() >= 2:
        return tensor.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "huge_stride" and tensor.numel() > 0:
        stride = 4099  # elements between neighbours
        base = torch.zeros(tensor.numel() * stride, dtype=tensor.dtype)
        view = base.as_strided(tensor.shape, [stride * s for s in tensor.contiguous().stride()])
        view.copy_(tensor)
        return view
    if layout == "expanded" and tensor.dim() >= 1 and tensor.numel() > 0:
        return tensor[:1].expand(tensor.shape)  # stride 0 along dim 0: every row is the first
    return tensor


def scalar(value: float, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor([value], dtype=dtype)


def to_meta(args):
    return [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]


def corrupt(draw, args: dict, candidates: dict) -> str | None:
    """Maybe make one argument bad; returns its name (None: all good). candidates: name -> list of bad values."""
    name = draw(st.sampled_from([None, None, *candidates]))
    if name is not None:
        args[name] = draw(st.sampled_from(candidates[name]))
    return name


def call(op_name: str, fn, args: dict, bad: str | None):
    print("CALL", op_name, {k: describe(v) for k, v in args.items()}, "bad:", bad, flush=True)
    try:
        out = fn(**args)
    except (RuntimeError, ValueError, TypeError) as error:
        assert bad is not None, f"{op_name} refused valid input: {error}"
        assert f"'{bad}'" in str(error), f"{op_name}: the error does not name argument '{bad}': {error}"
        return None
    assert bad is None, f"{op_name} accepted a bad argument '{bad}'"
    return out


def call_op(draw, name: str, args: dict, bad: str | None):
    """(out, meta) of torch.ops.fp8mp.<name>(**args), on the meta device at random when no argument is bad."""
    meta = bad is None and draw(st.booleans())
    call_args = dict(zip(args, to_meta(args.values()))) if meta else args
    return call(name, lambda **kw: getattr(ops, name)(*kw.values()), call_args, bad), meta


def call_for_values(draw, name: str, args: dict, bad: str | None, shape: tuple):
    """call_op, then the output's shape and dtype (args["out_dtype"]) checked; the output where its values are
    to be checked, None where the call was refused as it should be or ran on the meta device."""
    out, meta = call_op(draw, name, args, bad)
    if out is None:
        return None
    assert tuple(out.shape) == tuple(shape) and out.dtype == args["out_dtype"], (out.shape, out.dtype)
    return None if meta else out


# ----------------------------------------------------------------------------- references
def cast_reference(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> tuple[torch.Tensor, float]:
    """torch's own float8 cast of the fp32 product, with fp8mp's saturation; amax NaN-propagating."""
    codes = saturate(x.float() * scale.float(), fmt).to(FP8_DTYPES[fmt]).view(torch.uint8)
    amax = x.float().abs().max().item() if x.numel() else 0.0
    return codes, amax


def assert_codes(got: torch.Tensor, want: torch.Tensor, fmt: str) -> None:
    got = got.view(torch.uint8)
    nan = is_nan_code(want, fmt)
    assert torch.equal(is_nan_code(got, fmt), nan), "NaN codes differ"
    assert torch.equal(got[~nan], want[~nan]), f"codes differ: {got.tolist()} vs {want.tolist()}"


def assert_equal_nan(got: torch.Tensor, want: torch.Tensor) -> None:
    """NaN where want has NaN, bit-equal values elsewhere."""
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def assert_close64(got: torch.Tensor, want64: torch.Tensor, tol64: torch.Tensor) -> None:
    got64 = got.double()
    assert torch.equal(got64.isnan(), want64.isnan()), "NaN positions differ"
    finite = want64.isfinite()
    assert torch.equal(got64[~finite & ~want64.isnan()], want64[~finite & ~want64.isnan()]), "Inf differ"
    err = (got64 - want64).abs()[finite]
    assert bool((err <= tol64[finite]).all()), f"off by up to {(err - tol64[finite]).max().item():.3g} beyond tolerance"


# ----------------------------------------------------------------------------- ops
EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 100
SEED = int(os.environ.get("FP8MP_FUZZ_SEED", random.randrange(1 << 32)))  # printed first: a run can be replayed
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def fuzz_target(test):
    """A hypothesis test of `test(data)` with this run's seed and settings."""
    return seed(SEED)(SETTINGS(given(st.data())(test)))


@fuzz_target
def fuzz_cast(data):
    draw = data.draw
    shape = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    dtype, fmt = draw(st.sampled_from(HIGH)), draw(st.sampled_from(["e4m3", "e5m2", "E4M3"]))
    transpose = draw(st.booleans())
    x = draw(laid_out(draw(floats_tensor(shape, dtype))))
    scale = scalar(draw(st.sampled_from([1.0, 0.5, 3.7, 2.0**-10, 2.0**20, 2.0**-149])))
    args = {"x": x, "scale": scale, "amax": torch.full((1,), -1.0), "fmt": fmt}
    bad_amax = [torch.zeros(1, dtype=torch.float64), torch.zeros(3), torch.zeros(1, device="meta")]
    if x.dtype == torch.float32 and x.numel():
        bad_amax.append(x.as_strided((1,), (1,), x.storage_offset()))  # written in place over x's first element
    # A scale that is not finite and > 0 is refused on the host (on a GPU it makes every code NaN).
    bad_scales = [scale.double(), torch.ones(2), torch.ones(0), scale.to("meta")] + [
        scalar(v) for v in (0.0, -0.0, math.inf, math.nan, -2.0)]
    bad = corrupt(draw, args, {"x": [x.to(d) for d in BAD_DTYPES], "scale": bad_scales,
                               "amax": bad_amax, "fmt": ["e3m4", "fp8", ""]})
    meta = bad is None and draw(st.booleans())
    if meta:
        args = dict(zip(args, to_meta(args.values())))
    op = ops.cast_to_fp8_transpose if transpose else ops.cast_to_fp8
    if transpose and len(shape) != 2 and bad is None:
        bad = "x"  # the transposing cast takes 2-D inputs only
    out = call(str(op), lambda **kw: op(*kw.values()), args, bad)
    if out is None:
        return
    y, y_t = out if isinstance(out, tuple) else (out, None)
    assert y.shape == x.shape and y.dtype == FP8_DTYPES[fmt.lower()] and y.is_contiguous()
    if meta:
        return
    codes, amax = cast_reference(x, scale, fmt.lower())
    assert_codes(y, codes, fmt.lower())
    assert same_float(args["amax"].item(), amax), (args["amax"].item(), amax)
    if y_t is not None:
        assert y_t.is_contiguous() and torch.equal(y_t.view(torch.uint8), y.view(torch.uint8).t())


@fuzz_target
def fuzz_cast_from_fp8(data):
    draw = data.draw
    shape = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    fmt, out_dtype = draw(st.sampled_from(["e4m3", "e5m2"])), draw(st.sampled_from(HIGH))
    codes = torch.tensor(draw(st.lists(st.integers(0, 255), min_size=math.prod(shape), max_size=math.prod(shape))),
                         dtype=torch.uint8).reshape(shape)
    y = draw(laid_out(codes.view(FP8_DTYPES[fmt]).clone()))
    scale_inv = scalar(draw(st.sampled_from([1.0, 0.25, 3.7, 2.0**-30, 2.0**30, 2.0**-149])))
    args = {"y": y, "scale_inv": scale_inv, "out_dtype": out_dtype}
    bad_scales = [scale_inv.half(), torch.ones(1, 2)[:, :0]] + [scalar(v) for v in (0.0, math.inf, math.nan, -1.0)]
    bad = corrupt(draw, args, {"y": [y.float(), y.view(torch.uint8)], "scale_inv": bad_scales,
                               "out_dtype": [torch.float64, torch.int8]})
    out = call("cast_from_fp8", lambda **kw: ops.cast_from_fp8(*kw.values()), args, bad)
    if out is None:
        return
    want = (y.float() * scale_inv).to(out_dtype)  # torch decodes float8 exactly; one fp32 product, one rounding
    assert out.dtype == out_dtype and out.shape == y.shape
    assert_equal_nan(out, want)


@fuzz_target
def fuzz_gemm(data):
    draw = data.draw
    m, k, n = draw(st.integers(0, 9)), draw(st.integers(0, 20)), draw(st.integers(0, 9))
    fa, fb = draw(st.sampled_from(GEMM_FORMAT_PAIRS))
    out_dtype = draw(st.sampled_from(HIGH))

    def operand(rows, fmt):
        codes = draw(st.lists(st.integers(0, 255), min_size=rows * k, max_size=rows * k))
        return draw(laid_out(torch.tensor(codes, dtype=torch.uint8).reshape(rows, k).view(FP8_DTYPES[fmt]).clone()))

    a, b = operand(m, fa), operand(n, fb)
    sa, sb = scalar(draw(st.sampled_from([1.0, 2.0**-8, 3.0]))), scalar(draw(st.sampled_from([1.0, 0.5, 2.0**-12])))
    bias = draw(st.sampled_from([None, "bias"]))
    bias = draw(floats_tensor([n], out_dtype, finite_max=1e3)) if bias else None
    args = {"a": a, "a_scale_inv": sa, "b": b, "b_scale_inv": sb, "bias": bias, "out_dtype": out_dtype}
    bad = corrupt(draw, args, {"a": [a.float()], "b": [b.view(torch.uint8), torch.zeros(n, k + 1, dtype=FP8_DTYPES[fb])],
                               "a_scale_inv": [sa.double(), torch.ones(2)], "b_scale_inv": [sb.to("meta")],
                               "bias": [torch.zeros(n + 1, dtype=out_dtype), torch.zeros(n, dtype=torch.float64)],
                               "out_dtype": [torch.int32]})
    out = call("fp8_gemm", lambda **kw: ops.fp8_gemm(*kw.values()), args, bad)
    if out is None:
        return
    assert out.shape == (m, n) and out.dtype == out_dtype
    assert_gemm_close(out, a, b, float(sa), float(sb), bias)


def assert_gemm_close(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, sa: float, sb: float, bias) -> None:
    """out = a @ b.T * sa * sb + bias against float64, with fp32 accumulation's tolerance and one rounding."""
    a64, b64 = a.float().double(), b.float().double()
    scale = sa * sb
    want = (a64 @ b64.t()) * scale + (bias.double() if bias is not None else 0.0)
    abs_sum = (a64.abs() @ b64.abs().t()) * scale + (bias.double().abs() if bias is not None else 0.0)
    info = torch.finfo(out.dtype)
    tol = info.eps * want.abs().nan_to_num(0, 0, 0) + info.tiny + 1e-5 * abs_sum.nan_to_num(0, 0, 0)
    # Where a NaN or Inf code meets the sum, the fp32 result is non-finite exactly where float64's is;
    # past out_dtype's range the rounding overflows to Inf.
    top = torch.tensor(info.max, dtype=out.dtype)
    overflow = info.max + (info.max - torch.nextafter(top, torch.zeros_like(top)).item()) / 2  # rounds to Inf from here
    want = torch.where(want.abs() >= overflow, want.sign() * math.inf, want)
    assert_close64(out, want, tol)


@fuzz_target
def fuzz_norm(data):
    draw = data.draw
    rows, hidden = draw(st.lists(st.integers(0, 3), min_size=0, max_size=2)), draw(st.integers(1, 9))
    dtype, rms = draw(st.sampled_from(HIGH)), draw(st.booleans())
    x = draw(laid_out(draw(floats_tensor([*rows, hidden], dtype, finite_max=1e4))))
    if draw(st.booleans()) and x.numel():
        x = x.clone(memory_format=torch.contiguous_format)
        x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    weight = draw(st.sampled_from([None, "w"]))
    weight = draw(floats_tensor([hidden], dtype, finite_max=4.0)) if weight else None
    bias = draw(floats_tensor([hidden], dtype, finite_max=4.0)) if (not rms and weight is not None and draw(st.booleans())) else None
    eps = draw(st.sampled_from([1e-5, 1e-6, 0.5]))
    fp8 = draw(st.booleans())
    args = {"x": x, "weight": weight, "bias": bias, "eps": eps, "zero_centered_gamma": False}
    if rms:
        del args["bias"]
    if fp8:
        args.update(scale=scalar(draw(st.sampled_from([1.0, 16.0, 2.0**-4]))), amax=torch.zeros(1), fmt="e4m3")
    candidates = {"x": [x.to(torch.float64)], "weight": [torch.ones(hidden + 1, dtype=dtype), torch.ones(hidden, device="meta")],
                  "eps": [0.0, -1.0, math.nan, 1e-50]}
    if fp8:
        candidates.update(scale=[torch.ones(3)], amax=[torch.zeros(1, dtype=torch.int64)], fmt=["e5m3"])
    bad = corrupt(draw, args, candidates)
    name = ("rmsnorm_fwd" if rms else "layernorm_fwd") + ("_fp8" if fp8 else "")
    out = call(name, lambda **kw: getattr(ops, name)(*kw.values()), args, bad)
    if out is None:
        return
    x64 = x.double()
    w64 = weight.double() if weight is not None else None
    if rms:
        want = F.rms_norm(x64, (hidden,), w64, eps)
    else:
        want = F.layer_norm(x64, (hidden,), w64, bias.double() if bias is not None else None, eps)
    want = want.to(dtype).double()  # one rounding to x's dtype; fp32 statistics add a few fp32 ulps
    tol = torch.finfo(dtype).eps * 2 * want.abs().nan_to_num(0, 0, 0) + 1e-4 * (w64.abs().max().item() if w64 is not None else 1)
    if not fp8:
        assert out[0].dtype == dtype and out[0].shape == x.shape
        assert_close64(out[0], want, tol)
    else:
        assert out[0].dtype == torch.float8_e4m3fn and out[0].shape == x.shape
        decoded = out[0].float().double() / float(args["scale"])
        # The cast of a value within tolerance lands within one E4M3 step (2^-3 relative) of the reference.
        assert_close64(decoded, saturate(want.float() * args["scale"], "e4m3").double() / float(args["scale"]),
                       tol + 0.125 * want.abs().nan_to_num(0, 0, 0) + 2.0**-9 / float(args["scale"]))


@fuzz_target
def fuzz_scale_update(data):
    draw = data.draw
    t, h = draw(st.integers(0, 4)), draw(st.integers(1, 4))
    amax = draw(floats_tensor([t], torch.float32)).abs()
    history = draw(floats_tensor([h, t], torch.float32)).abs()
    scale = draw(floats_tensor([t], torch.float32, finite_max=1e6)).abs() + 1e-3
    fp8_max = torch.tensor(draw(st.lists(st.sampled_from([448.0, 57344.0]), min_size=t, max_size=t)), dtype=torch.float32)
    margin, algo = draw(st.integers(0, 3)), draw(st.sampled_from(["max", "most_recent"]))
    args = {"amax": amax, "amax_history": history.clone(), "scale": scale.clone(), "scale_inv": torch.zeros(t),
            "fp8_max": fp8_max, "margin": margin, "amax_compute_algo": algo}
    bad = corrupt(draw, args, {"amax": [amax.double(), amax.reshape(t, 1)], "amax_history": [torch.zeros(h, t + 1)],
                               "scale": [torch.zeros(t + 1)], "margin": [-1], "amax_compute_algo": ["mean"]})
    call("update_amax_history_and_scale", lambda **kw: ops.update_amax_history_and_scale(*kw.values()), args, bad)
    if bad is not None:
        return
    rolled = torch.cat([amax.reshape(1, t), history[:-1]])  # the paper's rule, from scratch
    effective = rolled.amax(0) if algo == "max" else amax
    new = fp8_max / effective / 2.0**margin
    usable = (effective > 0) & effective.isfinite() & (new > 0) & new.isfinite()
    want = torch.where(usable, new, scale)
    assert torch.equal(args["amax_history"].nan_to_num(123.0), rolled.nan_to_num(123.0))
    assert torch.equal(args["scale"], want) and torch.equal(args["scale_inv"], 1 / want)


@fuzz_target
def fuzz_cast_dbias(data):
    draw = data.draw
    rows, cols = draw(st.integers(0, 70)), draw(st.integers(0, 6))
    dtype, fmt = draw(st.sampled_from(HIGH)), draw(st.sampled_from(["e4m3", "e5m2"]))
    x = draw(laid_out(draw(floats_tensor([rows, cols], dtype, finite_max=None if draw(st.booleans()) else 1e4))))
    scale = scalar(draw(st.sampled_from([1.0, 0.5, 2.0**-10, 2.0**20, 3.7])))
    args = {"x": x, "scale": scale, "amax": torch.full((1,), -1.0), "fmt": fmt}
    bad = corrupt(draw, args, {"x": [x.to(torch.float64), x.reshape(1, rows, cols)], "scale": [scale.double(), torch.ones(2)],
                               "amax": [torch.zeros(2)], "fmt": ["e3m4"]})
    meta = bad is None and draw(st.booleans())
    if meta:
        args = dict(zip(args, to_meta(args.values())))
    out = call("cast_to_fp8_transpose_dbias", lambda **kw: ops.cast_to_fp8_transpose_dbias(*kw.values()), args, bad)
    if out is None:
        return
    y, y_t, dbias = out
    assert y.shape == x.shape and y_t.shape == (cols, rows) and dbias.shape == (cols,) and dbias.dtype == torch.float32
    if meta:
        return
    codes, amax = cast_reference(x, scale, fmt)
    assert_codes(y, codes, fmt)
    assert same_float(args["amax"].item(), amax)
    assert torch.equal(y_t.view(torch.uint8), y.view(torch.uint8).t())
    want = torch.from_numpy(dbias_reference(x))  # the documented order of the fp32 sums
    assert_equal_nan(dbias, want)


@fuzz_target
def fuzz_norm_bwd(data):
    draw = data.draw
    rows, hidden = draw(st.integers(0, 5)), draw(st.integers(1, 9))
    dtype, rms, zc = draw(st.sampled_from(HIGH)), draw(st.booleans()), draw(st.booleans())
    x = draw(laid_out(draw(floats_tensor([rows, hidden], dtype, finite_max=1e2))))
    go = draw(floats_tensor([rows, hidden], dtype, finite_max=1e2))
    weight = draw(floats_tensor([hidden], dtype, finite_max=4.0)) if draw(st.booleans()) else None
    eps = draw(st.sampled_from([1e-5, 0.5]))
    if rms:
        _, rstd = ops.rmsnorm_fwd(x, weight, eps, zc)
        args = {"grad_out": go, "x": x, "rstd": rstd, "weight": weight, "zero_centered_gamma": zc}
    else:
        _, mean, rstd = ops.layernorm_fwd(x, weight, None, eps, zc)
        args = {"grad_out": go, "x": x, "mean": mean, "rstd": rstd, "weight": weight, "zero_centered_gamma": zc}
    candidates = {"grad_out": [go[:, :-1] if hidden > 1 else go.reshape(rows, 1, 1), go.double()],
                  "rstd": [rstd.reshape(rows, 1)[:0] if rows else torch.zeros(3), rstd.double()],
                  "weight": [torch.ones(hidden + 1, dtype=dtype)]}
    if not rms:
        candidates["mean"] = [torch.zeros(rows + 1)]
    bad = corrupt(draw, args, candidates)
    name = "rmsnorm_bwd" if rms else "layernorm_bwd"
    meta = bad is None and draw(st.booleans())
    call_args = dict(zip(args, to_meta(args.values()))) if meta else args
    out = call(name, lambda **kw: getattr(ops, name)(*kw.values()), call_args, bad)
    if out is None:
        return
    assert out[0].shape == x.shape and out[0].dtype == dtype
    if meta:
        return
    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_() if weight is not None else None
    g64 = None if w64 is None else (w64 + 1 if zc else w64)
    want = F.rms_norm(x64, (hidden,), g64, eps) if rms else F.layer_norm(x64, (hidden,), g64, None, eps)
    grads = torch.autograd.grad(want, [t for t in (x64, w64) if t is not None], go.double())
    # Each gradient is a sum over terms of size |go| |g| rstd (1 + |xhat|)^2; fp32 statistics and x's dtype's
    # rounding of the result leave a relative error of a few of that dtype's eps on that scale.
    rstd64 = 1 / (x64.detach().var(-1, unbiased=False, keepdim=True) + eps).sqrt() if not rms else \
        1 / ((x64.detach() ** 2).mean(-1, keepdim=True) + eps).sqrt()
    gmax = 1.0 if g64 is None else g64.detach().abs().max().item()
    xhat = (x64.detach() * rstd64).abs().max().item() if x.numel() else 0.0
    term = (go.double().abs().max().item() if go.numel() else 0.0) * gmax * (rstd64.max().item() if rows else 0.0) * (1 + xhat) ** 2
    tol = 16 * hidden * torch.finfo(dtype).eps * term + 1e-6
    assert (out[0].double() - grads[0]).abs().max().item() <= tol if x.numel() else True, "grad_x"
    if weight is not None:
        tol_w = 16 * max(rows, 1) * torch.finfo(dtype).eps * (go.double().abs().sum(0) * (1 + xhat)).max().item() + 1e-6
        assert out[1].shape == weight.shape and (out[1].double() - grads[1]).abs().max().item() <= tol_w, "grad_weight"


def finite_codes(draw, shape, fmt) -> torch.Tensor:
    """FP8 codes of `shape` in fmt, NaN (and E5M2's Inf) codes replaced by zero."""
    n = math.prod(shape)
    codes = torch.tensor(draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)), dtype=torch.uint8).reshape(shape)
    exponent_ones = (codes & 0x7F) >= (0x7F if fmt == "e4m3" else 0x7C)
    return torch.where(exponent_ones, torch.zeros_like(codes), codes).view(FP8_DTYPES[fmt])


BLOCK_MODES = ["fp32", "pow2", "e8m0_floor", "e8m0_rceil"]


@fuzz_target
def fuzz_block_quantize(data):
    draw = data.draw
    mode = draw(st.sampled_from(BLOCK_MODES))
    if mode.startswith("e8m0"):  # torchao's MX reference: 1 x 32 blocks along rows of a multiple of 32
        rows, cols, blocks = draw(st.integers(0, 4)), 32 * draw(st.integers(1, 2)), (1, 32)
    else:
        rows, cols = draw(st.integers(0, 9)), draw(st.integers(1, 9))
        blocks = (draw(st.integers(1, 4)), draw(st.integers(1, 5)))
    # torchao's to_mx takes float32 and bfloat16 only
    dtype = draw(st.sampled_from(HIGH[:2] if mode.startswith("e8m0") else HIGH))
    fmt = draw(st.sampled_from(["e4m3", "e5m2"]))
    x = draw(laid_out(draw(floats_tensor([rows, cols], dtype, finite_max=1e4))))
    args = {"x": x, "block_rows": blocks[0], "block_cols": blocks[1], "fmt": fmt, "scale_mode": mode}
    bad = corrupt(draw, args, {"x": [x.reshape(1, rows, cols), x.to(torch.float64)], "block_rows": [0, -3],
                               "block_cols": [0], "fmt": ["e3m4"], "scale_mode": ["e8m0", "fp16"]})
    out, meta = call_op(draw, "block_quantize", args, bad)
    if out is None:
        return
    data_q, scale_inv = out
    tiles = (-(-rows // blocks[0]), -(-cols // blocks[1]))
    assert data_q.shape == x.shape and data_q.dtype == FP8_DTYPES[fmt] and scale_inv.shape == tiles
    assert scale_inv.dtype == (torch.float8_e8m0fnu if mode.startswith("e8m0") else torch.float32)
    if meta:
        return
    if mode.startswith("e8m0"):
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        if rows == 0:
            return
        ref_scale, ref_data = to_mx(x.contiguous(), FP8_DTYPES[fmt], 32, ScaleCalculationMode(mode.removeprefix("e8m0_")))
        assert torch.equal(scale_inv.view(torch.uint8), ref_scale.view(torch.uint8).reshape(tiles))
    else:
        ref_data, ref_scale_inv = deepseek_quantize(x, *blocks, FP8_DTYPES[fmt], mode == "pow2")
        assert torch.equal(scale_inv, ref_scale_inv), (scale_inv, ref_scale_inv)
    assert torch.equal(data_q.view(torch.uint8), ref_data.view(torch.uint8))


@fuzz_target
def fuzz_block_quantize_transpose(data):
    """Bit for bit the two block_quantize calls (whose own values fuzz_block_quantize checks against references)."""
    draw = data.draw
    rows, cols = draw(st.integers(0, 9)), draw(st.integers(0, 9))
    row_block, col_block = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    dtype, fmt, mode = draw(st.sampled_from(HIGH)), draw(st.sampled_from(["e4m3", "e5m2"])), draw(st.sampled_from(BLOCK_MODES))
    x = draw(laid_out(draw(floats_tensor([rows, cols], dtype))))
    args = {"x": x, "row_block": row_block, "col_block": col_block, "fmt": fmt, "scale_mode": mode}
    bad = corrupt(draw, args, {"x": [x.reshape(1, rows, cols)], "row_block": [0], "col_block": [-1], "fmt": ["fp8"],
                               "scale_mode": [""]})
    out, meta = call_op(draw, "block_quantize_transpose", args, bad)
    if out is None:
        return
    want = (*ops.block_quantize(x, 1, row_block, fmt, mode), *ops.block_quantize(x.t(), 1, col_block, fmt, mode))
    for got, expected in zip(out, want):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        if not meta:
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))


@fuzz_target
def fuzz_norm_fwd_block_fp8(data):
    """The four outputs are block_quantize_transpose of the norm output (the documented contract), mean and rstd
    layernorm_fwd's / rmsnorm_fwd's (both checked against float64 by fuzz_norm)."""
    draw = data.draw
    rows, hidden = draw(st.integers(0, 6)), draw(st.integers(1, 9))
    dtype, is_layernorm, zc = draw(st.sampled_from(HIGH)), draw(st.booleans()), draw(st.booleans())
    x = draw(laid_out(draw(floats_tensor([rows, hidden], dtype, finite_max=1e3))))
    weight = draw(floats_tensor([hidden], dtype, finite_max=4.0)) if draw(st.booleans()) else None
    bias = draw(floats_tensor([hidden], dtype, finite_max=4.0)) if is_layernorm and draw(st.booleans()) else None
    row_block, col_block = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    fmt, mode, eps = draw(st.sampled_from(["e4m3", "e5m2"])), draw(st.sampled_from(BLOCK_MODES)), draw(st.sampled_from([1e-5, 0.5]))
    args = {"x": x, "weight": weight, "bias": bias, "eps": eps, "is_layernorm": is_layernorm, "zero_centered_gamma": zc,
            "row_block": row_block, "col_block": col_block, "fmt": fmt, "scale_mode": mode}
    bad = corrupt(draw, args, {"x": [x.reshape(1, rows, hidden), x.double()], "weight": [torch.ones(hidden + 1, dtype=dtype)],
                               "eps": [0.0, math.nan], "row_block": [0], "fmt": ["e5m3"], "scale_mode": ["x"]})
    out, meta = call_op(draw, "norm_fwd_block_fp8", args, bad)
    if out is None:
        return
    if is_layernorm:
        y, mean, rstd = ops.layernorm_fwd(x, weight, bias, eps, zc)
    else:
        (y, rstd), mean = ops.rmsnorm_fwd(x, weight, eps, zc), torch.zeros(0)
    want = (*ops.block_quantize_transpose(y, row_block, col_block, fmt, mode), mean, rstd)
    for got, expected in zip(out, want):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        if not meta:
            assert torch.equal(got.view(torch.uint8) if got.element_size() == 1 else got, expected.view(torch.uint8)
                               if expected.element_size() == 1 else expected)


@fuzz_target
def fuzz_block_scaled_gemm(data):
    draw = data.draw
    m, n, k = draw(st.integers(0, 7)), draw(st.integers(0, 7)), draw(st.integers(0, 20))
    a_rows, b_rows, block_k = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 8))
    fa, fb = draw(st.sampled_from(GEMM_FORMAT_PAIRS))
    e8m0, out_dtype = draw(st.booleans()), draw(st.sampled_from(HIGH))
    chunks = -(-k // block_k)

    def scales(rows):
        exps = draw(st.lists(st.integers(-12, 6), min_size=rows * chunks, max_size=rows * chunks))
        s = torch.tensor([2.0**e for e in exps], dtype=torch.float32).reshape(rows, chunks)
        return s.to(torch.float8_e8m0fnu) if e8m0 else s * draw(st.sampled_from([1.0, 1.5, 0.75]))

    a, b = draw(laid_out(finite_codes(draw, [m, k], fa))), draw(laid_out(finite_codes(draw, [n, k], fb)))
    sa, sb = scales(-(-m // a_rows)), scales(-(-n // b_rows))
    bias = draw(floats_tensor([n], out_dtype, finite_max=1e3)) if draw(st.booleans()) else None
    args = {"a": a, "a_scale_inv": sa, "b": b, "b_scale_inv": sb, "a_block_rows": a_rows, "b_block_rows": b_rows,
            "block_k": block_k, "bias": bias, "out_dtype": out_dtype}
    bad = corrupt(draw, args, {"a": [a.float()], "b": [torch.zeros(n, k + 1, dtype=FP8_DTYPES[fb])],
                               "a_scale_inv": [torch.ones(sa.shape[0] + 1, chunks)], "b_scale_inv": [sb.double()],
                               "block_k": [0], "a_block_rows": [0], "bias": [torch.zeros(n + 1, dtype=out_dtype)],
                               "out_dtype": [torch.int32]})
    out = call_for_values(draw, "block_scaled_gemm", args, bad, (m, n))
    if out is None:
        return
    assert_block_gemm_close(out, a, sa, b, sb, a_rows, b_rows, block_k, bias)


def assert_block_gemm_close(out, a, sa, b, sb, a_rows: int, b_rows: int, block_k: int, bias) -> None:
    """out against the block-scaled GEMM's float64 reference: fp32 accumulation's tolerance per K block."""
    m, k, n = a.shape[0], a.shape[1], b.shape[0]
    want = block_gemm_reference(a, sa, b, sb, a_rows, b_rows, block_k, bias, torch.float32).double()
    sa_rows = sa.float().double().repeat_interleave(a_rows, 0)[:m]
    sb_rows = sb.float().double().repeat_interleave(b_rows, 0)[:n]
    abs_sum = torch.zeros(m, n, dtype=torch.float64)
    for c, k0 in enumerate(range(0, k, block_k)):
        part = a.float().double()[:, k0:k0 + block_k].abs() @ b.float().double()[:, k0:k0 + block_k].abs().T
        abs_sum += part * (sa_rows[:, c:c + 1] * sb_rows[:, c].unsqueeze(0))
    info = torch.finfo(out.dtype)
    tol = info.eps * want.abs() + 1e-5 * abs_sum + info.tiny
    assert_close64(out, want.to(out.dtype).double() if out.dtype != torch.float32 else want, tol + info.eps * want.abs())


# ----------------------------------------------------------------------------- grouped GEMMs
@st.composite
def group_offsets(draw, max_groups: int = 5, max_rows: int = 4) -> tuple[list[int], torch.Tensor]:
    """(rows per group, offs): torch._grouped_mm's int32 cumulative ends; empty groups included."""
    counts = draw(st.lists(st.integers(0, max_rows), min_size=1, max_size=max_groups))
    return counts, torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)


def bad_offsets(offs: torch.Tensor, total: int) -> list[torch.Tensor]:
    """offs made bad: int64, every end past the token count, the last end short of it, and the ends in reverse
    order where that makes them decrease."""
    bad = [offs.long(), torch.tensor([total + 1], dtype=torch.int32).expand(offs.shape[0]).clone()]
    if total > 0:
        short = offs.clone()
        short[-1] = total - 1
        bad.append(short)
    if offs[0] < offs[-1]:
        bad.append(offs.flip(0))
    return bad


def group_bounds(counts: list[int]) -> list[tuple[int, int]]:
    ends = [sum(counts[:i + 1]) for i in range(len(counts))]
    return [(end - count, end) for count, end in zip(counts, ends)]


@fuzz_target
def fuzz_grouped_gemm(data):
    draw = data.draw
    counts, offs = draw(group_offsets())
    groups, m = len(counts), sum(counts)
    k, n = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32]))
    fa, fb = draw(st.sampled_from(GEMM_FORMAT_PAIRS))
    out_dtype = draw(st.sampled_from(HIGH))
    codes = draw(st.lists(st.integers(0, 255), min_size=m * k, max_size=m * k))
    a = draw(laid_out(torch.tensor(codes, dtype=torch.uint8).reshape(m, k).view(FP8_DTYPES[fa]).clone()))
    b = finite_codes(draw, [groups, n, k], fb)
    sa = scalar(draw(st.sampled_from([1.0, 2.0**-8, 3.0])))
    sb = torch.tensor(draw(st.lists(st.sampled_from([1.0, 0.5, 2.0**-12, 7.0]), min_size=groups, max_size=groups)))
    bias = draw(floats_tensor([groups, n], out_dtype, finite_max=1e3)) if draw(st.booleans()) else None
    args = {"a": a, "a_scale_inv": sa, "b": b, "b_scale_inv": sb, "offs": offs, "bias": bias, "out_dtype": out_dtype}
    bad = corrupt(draw, args, {"a": [a.float()], "b": [torch.zeros(groups + 1, n, k, dtype=FP8_DTYPES[fb]),
                                                      torch.zeros(groups, n, k + 8, dtype=FP8_DTYPES[fb])],
                               "a_scale_inv": [sa.double(), torch.ones(2)], "b_scale_inv": [torch.ones(1, groups).double()],
                               "offs": bad_offsets(offs, m), "bias": [torch.zeros(groups, n + 1, dtype=out_dtype)],
                               "out_dtype": [torch.int32]})
    out = call_for_values(draw, "fp8_grouped_gemm", args, bad, (m, n))
    if out is None:
        return
    for g, (start, end) in enumerate(group_bounds(counts)):
        assert_gemm_close(out[start:end], a[start:end], b[g], float(sa), float(sb[g]),
                          bias[g] if bias is not None else None)


@fuzz_target
def fuzz_grouped_gemm_wgrad(data):
    draw = data.draw
    counts, offs = draw(group_offsets())
    tokens = sum(counts)
    n, k = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32]))
    fa, fb = draw(st.sampled_from(GEMM_FORMAT_PAIRS))
    out_dtype = draw(st.sampled_from(HIGH))
    a = draw(laid_out(finite_codes(draw, [n, tokens], fa)))
    b = draw(laid_out(finite_codes(draw, [k, tokens], fb)))
    sa, sb = scalar(draw(st.sampled_from([1.0, 2.0**-8, 3.0]))), scalar(draw(st.sampled_from([1.0, 0.5, 2.0**-12])))
    args = {"a": a, "a_scale_inv": sa, "b": b, "b_scale_inv": sb, "offs": offs, "out_dtype": out_dtype}
    bad = corrupt(draw, args, {"a": [a.float(), finite_codes(draw, [n + 8, tokens], fa)[:n + 3]],
                               "b": [finite_codes(draw, [k, tokens + 1], fb)], "a_scale_inv": [torch.ones(3)],
                               "b_scale_inv": [sb.half()], "offs": bad_offsets(offs, tokens),
                               "out_dtype": [torch.float64]})
    out = call_for_values(draw, "fp8_grouped_gemm_wgrad", args, bad, (len(counts), n, k))
    if out is None:
        return
    for g, (start, end) in enumerate(group_bounds(counts)):
        assert_gemm_close(out[g], a[:, start:end], b[:, start:end], float(sa), float(sb), None)


@fuzz_target
def fuzz_block_scaled_grouped_gemm(data):
    draw = data.draw
    counts, offs = draw(group_offsets())
    groups, m = len(counts), sum(counts)
    k, n = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32]))
    b_rows, block_k = draw(st.sampled_from([1, 3, 16])), draw(st.sampled_from([8, 16, 32]))
    fa, fb = draw(st.sampled_from(GEMM_FORMAT_PAIRS))
    e8m0, out_dtype = draw(st.booleans()), draw(st.sampled_from(HIGH))
    chunks = -(-k // block_k)

    def scales(*shape):
        exps = draw(st.lists(st.integers(-12, 6), min_size=math.prod(shape), max_size=math.prod(shape)))
        s = torch.tensor([2.0**e for e in exps], dtype=torch.float32).reshape(shape)
        return s.to(torch.float8_e8m0fnu) if e8m0 else s * draw(st.sampled_from([1.0, 1.5, 0.75]))

    a, b = draw(laid_out(finite_codes(draw, [m, k], fa))), finite_codes(draw, [groups, n, k], fb)
    sa, sb = scales(m, chunks), scales(groups, -(-n // b_rows), chunks)
    bias = draw(floats_tensor([groups, n], out_dtype, finite_max=1e3)) if draw(st.booleans()) else None
    args = {"a": a, "a_scale_inv": sa, "b": b, "b_scale_inv": sb, "offs": offs, "a_block_rows": 1,
            "b_block_rows": b_rows, "block_k": block_k, "bias": bias, "out_dtype": out_dtype}
    bad = corrupt(draw, args, {"a": [a.float()], "a_scale_inv": [torch.ones(m + 1, chunks)],
                               "b_scale_inv": [sb.double()], "offs": bad_offsets(offs, m), "a_block_rows": [2],
                               "b_block_rows": [0], "block_k": [0], "out_dtype": [torch.int32]})
    out = call_for_values(draw, "block_scaled_grouped_gemm", args, bad, (m, n))
    if out is None:
        return
    for g, (start, end) in enumerate(group_bounds(counts)):
        assert_block_gemm_close(out[start:end], a[start:end], sa[start:end], b[g], sb[g], 1, b_rows, block_k,
                                bias[g] if bias is not None else None)


@fuzz_target
def fuzz_block_scaled_grouped_gemm_wgrad(data):
    draw = data.draw
    counts, offs = draw(group_offsets(max_rows=40))
    groups, tokens = len(counts), sum(counts)
    n, k = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32]))
    block_k = draw(st.sampled_from([8, 32, max(counts)]))
    fa, fb = draw(st.sampled_from(GEMM_FORMAT_PAIRS))
    e8m0, out_dtype = draw(st.booleans()), draw(st.sampled_from(HIGH))
    group_chunks = [-(-c // max(block_k, 1)) for c in counts]
    chunks = sum(group_chunks)

    def scales(rows):
        exps = draw(st.lists(st.integers(-12, 6), min_size=rows * chunks, max_size=rows * chunks))
        s = torch.tensor([2.0**e for e in exps], dtype=torch.float32).reshape(rows, chunks)
        return s.to(torch.float8_e8m0fnu) if e8m0 else s * draw(st.sampled_from([1.0, 1.5, 0.75]))

    a = draw(laid_out(finite_codes(draw, [n, tokens], fa)))
    b = draw(laid_out(finite_codes(draw, [k, tokens], fb)))
    sa, sb = scales(n), scales(k)
    args = {"a": a, "a_scale_inv": sa, "b": b, "b_scale_inv": sb, "offs": offs, "block_k": max(block_k, 1),
            "out_dtype": out_dtype}
    bad = corrupt(draw, args, {"a": [a.float()], "a_scale_inv": [torch.ones(n + 1, chunks), torch.ones(n)],
                               "b_scale_inv": [sb.double(), torch.ones(k, chunks + 1)],
                               "b": [finite_codes(draw, [k, tokens + 1], fb)],
                               "offs": bad_offsets(offs, tokens), "block_k": [0], "out_dtype": [torch.int32]})
    out = call_for_values(draw, "block_scaled_grouped_gemm_wgrad", args, bad, (groups, n, k))
    if out is None:
        return
    chunk0 = 0
    for g, (start, end) in enumerate(group_bounds(counts)):
        cols = slice(chunk0, chunk0 + group_chunks[g])
        assert_block_gemm_close(out[g], a[:, start:end], sa[:, cols], b[:, start:end], sb[:, cols], 1, 1,
                                max(block_k, 1), None)
        chunk0 += group_chunks[g]


# ----------------------------------------------------------------------------- optimizer steps
E4M3_STEP = 2.0**-3  # E4M3's relative spacing (3 mantissa bits): a stochastic rounding moves by less
E4M3_SUBNORMAL = 2.0**-9  # E4M3's smallest subnormal, in the block's units (448 = the block's amax)
OPT_STATE_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn]


def optimizer_state(draw, numel: int, dtype: torch.dtype, second_moment: bool):
    """(state, scale or None, the float64 values the rule sees): random values (>= 0 for a second moment), FP8
    ones per 128-element block, AdamW's second moment in FP8 as sqrt(v)."""
    sqrt_domain = second_moment and dtype == torch.float8_e4m3fn
    values = torch.tensor(draw(st.lists(st.sampled_from([0.0, 1e-3, -0.25, 0.5, 3.0, -7.0]),
                                        min_size=numel, max_size=numel)), dtype=torch.float32)
    if second_moment:
        values = values.abs()
    if dtype != torch.float8_e4m3fn:  # float32 and bfloat16 states hold the value itself
        state = values.to(dtype)
        return state, None, state.double()
    blocks = fp8mp.ops.optim.state_scale_numel(numel)
    scale = torch.tensor(draw(st.lists(st.sampled_from([0.0, 2.0**-10, 0.01, 1.0]), min_size=blocks,
                                       max_size=blocks)), dtype=torch.float32)
    state = values.clamp(-448, 448).to(torch.float8_e4m3fn)
    stored = state.float().double() * scale.double().repeat_interleave(128)[:numel]
    return state, scale, stored * stored if sqrt_domain else stored


def assert_state_close(state, scale, want64: torch.Tensor, sqrt_domain: bool) -> None:
    """A new state against its float64 value: float32 to fp32 rounding, bfloat16 and FP8 within one step of their
    grids (stochastic rounding picks a neighbour), FP8 with scale = block amax / 448 of what it stores (sqrt(v)
    for AdamW's second moment)."""
    if state.dtype != torch.float8_e4m3fn:
        rel = 1e-6 if state.dtype == torch.float32 else 2.0**-7 + 1e-6
        assert bool(((state.double() - want64).abs() <= rel * want64.abs() + 1e-30).all()), "state off its grid"
        return
    stored = want64.sqrt() if sqrt_domain else want64
    numel = stored.numel()
    padded = torch.zeros(scale.numel() * 128, dtype=torch.float64)
    padded[:numel] = stored.abs()
    block_amax = padded.reshape(-1, 128).amax(1)
    assert torch.allclose(scale.double(), block_amax / 448, rtol=1e-6, atol=0), "block scales differ from amax / 448"
    per_element = block_amax.repeat_interleave(128)[:numel] / 448
    got = state.float().double() * scale.double().repeat_interleave(128)[:numel]
    tol = E4M3_STEP * stored.abs() + E4M3_SUBNORMAL * per_element + 1e-6 * stored.abs()
    assert bool(((got - stored).abs() <= tol).all()), "FP8 state off its grid"


def optimizer_args(draw, lion: bool):
    numel = draw(st.sampled_from([0, 1, 5, 130, 300]))
    shape = [numel] if numel < 100 or draw(st.booleans()) else [numel // 10, 10] if numel % 10 == 0 else [numel]
    param_dtype, state_dtype = draw(st.sampled_from([torch.float32, torch.bfloat16])), draw(st.sampled_from(OPT_STATE_DTYPES))
    pool = st.sampled_from([0.0, 1e-3, -0.5, 2.0, -3.0, 0.125])
    param = torch.tensor(draw(st.lists(pool, min_size=numel, max_size=numel)), dtype=torch.float32).to(param_dtype)
    grad = torch.tensor(draw(st.lists(pool, min_size=numel, max_size=numel)), dtype=torch.float32).to(
        draw(st.sampled_from([torch.float32, torch.bfloat16])))
    m, m_scale, m64 = optimizer_state(draw, numel, state_dtype, second_moment=False)
    args = {"param": param.reshape(shape), "grad": grad.reshape(shape), "exp_avg": m.reshape(shape), "exp_avg_scale": m_scale}
    seen = {"exp_avg": m64}
    if not lion:
        v, v_scale, v64 = optimizer_state(draw, numel, state_dtype, second_moment=True)
        args.update(exp_avg_sq=v.reshape(shape), exp_avg_sq_scale=v_scale)
        seen["exp_avg_sq"] = v64
    args.update(step=torch.tensor([draw(st.integers(0, 5))], dtype=torch.int64),
                found_inf=draw(st.sampled_from([None, torch.zeros(1), torch.ones(1)])),
                lr=draw(st.sampled_from([0.0, 1e-3, 0.1])), beta1=draw(st.sampled_from([0.0, 0.9])),
                beta2=draw(st.sampled_from([0.0, 0.99] if lion else [0.0, 0.999])))
    if not lion:
        args["eps"] = draw(st.sampled_from([1e-8, 1e-3]))
    args.update(weight_decay=draw(st.sampled_from([0.0, 0.01])), seed=draw(st.integers(-2**63, 2**63 - 1)),
                element_offset=draw(st.sampled_from([0, 128, 2**40])))  # a shard's offset in a larger tensor
    bad_values = {"param": [args["param"].double()], "grad": [torch.zeros(numel + 1)], "element_offset": [-128],
                  "exp_avg": [args["exp_avg"].half()], "step": [args["step"].int()],
                  "found_inf": [torch.zeros(1, dtype=torch.float64)], "lr": [-1.0, math.nan],
                  "beta1": [1.5, -0.1], "weight_decay": [math.inf]}
    if not lion:
        bad_values.update(beta1=[1.0], eps=[0.0, math.inf])
    if state_dtype == torch.float8_e4m3fn:
        bad_values["exp_avg_scale"] = [None, torch.zeros(m_scale.numel() + 1)]
        bad_values["element_offset"].append(64)  # FP8 blocks: a multiple of 128
    else:
        bad_values["exp_avg_scale"] = [torch.zeros(1)]
    return args, seen, bad_values


def fuzz_optimizer_step(data, lion: bool):
    draw = data.draw
    args, seen, bad_values = optimizer_args(draw, lion)
    bad = corrupt(draw, args, bad_values)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    meta = bad is None and draw(st.booleans())
    call_args = dict(zip(args, to_meta(args.values()))) if meta else args
    name = "lion_step" if lion else "adamw_step"
    out = call(name, lambda **kw: getattr(ops, name)(*kw.values()), call_args, bad)
    if bad is not None or meta:
        return
    assert out is None
    skipped = args["found_inf"] is not None and float(args["found_inf"]) != 0
    if skipped:  # nothing changes, the step count included
        for key, value in before.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(args[key].view(torch.uint8), value.view(torch.uint8)), f"{key} changed in a skipped step"
        return
    assert int(args["step"]) == int(before["step"]) + 1
    p64, g64 = before["param"].double().reshape(-1), before["grad"].double().reshape(-1)
    m0 = seen["exp_avg"]
    lr, b1, b2, wd, t = args["lr"], args["beta1"], args["beta2"], args["weight_decay"], int(args["step"])
    if lion:  # Chen et al. (2023), decoupled weight decay
        direction = b1 * m0 + (1 - b1) * g64
        want_p = p64 * (1 - lr * wd) - lr * direction.sign()
        # A direction within fp32 rounding of 0 may take either sign (or none) in fp32.
        ambiguous = direction.abs() <= 1e-6 * (b1 * m0.abs() + (1 - b1) * g64.abs())
        # lr itself reaches the kernel rounded to fp32.
        tol = torch.where(ambiguous, torch.full_like(p64, 2 * lr), torch.full_like(p64, 1e-6 * lr))
        want_states = {"exp_avg": b2 * m0 + (1 - b2) * g64}
    else:  # torch.optim.AdamW's formula (Loshchilov & Hutter), t = the step count after this step
        m = b1 * m0 + (1 - b1) * g64
        v = b2 * seen["exp_avg_sq"] + (1 - b2) * g64 * g64
        update = lr / (1 - b1**t) * m / (v.sqrt() / math.sqrt(1 - b2**t) + args["eps"])
        want_p = p64 * (1 - lr * wd) - update
        tol = 1e-5 * update.abs()
        want_states = {"exp_avg": m, "exp_avg_sq": v}
    tol = tol + 1e-6 * p64.abs() + 1e-30
    if args["param"].dtype == torch.bfloat16:  # stochastic rounding: one bf16 step at most
        tol = tol + 2.0**-7 * want_p.abs() + 2.0**-133
    got_p = args["param"].double().reshape(-1)
    assert bool(((got_p - want_p).abs() <= tol).all()), f"{name}: parameter off by {(got_p - want_p).abs().max():.3g}"
    for key, want in want_states.items():
        assert_state_close(args[key].reshape(-1), args.get(key + "_scale"), want, sqrt_domain=key == "exp_avg_sq")


@fuzz_target
def fuzz_adamw_step(data):
    fuzz_optimizer_step(data, lion=False)


@fuzz_target
def fuzz_lion_step(data):
    fuzz_optimizer_step(data, lion=True)


# ----------------------------------------------------------------------------- modules
def cast64(t: torch.Tensor) -> torch.Tensor:
    """Current scaling from scratch, in float64: scale = 448 / amax where that is finite and > 0 (else 1), E4M3."""
    amax = t.float().abs().max() if t.numel() else torch.tensor(0.0)
    s = 448.0 / amax if bool(amax.isfinite() & (amax > 0) & (448.0 / amax).isfinite() & (448.0 / amax > 0)) else torch.tensor(1.0)
    return saturate(t.float() * s, "e4m3").to(torch.float8_e4m3fn).float().double() / s.double()


def fp8_linear64(x: torch.Tensor, weight64: torch.Tensor, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, tolerance) of an FP8 linear with x cast by current scaling and weight64 [out, in] already decoded."""
    x64 = cast64(x).reshape(-1, x.shape[-1])
    out = x64 @ weight64.t() + (bias.double() if bias is not None else 0.0)
    tol = 1e-5 * (x64.abs() @ weight64.abs().t()) + 1e-6 + 1e-6 * out.abs().nan_to_num(0, 0, 0)
    shape = (*x.shape[:-1], weight64.shape[0])
    return out.reshape(shape).float().double(), tol.reshape(shape)


MODULE_KINDS = ["linear", "conv1d", "layernorm", "rmsnorm", "layernorm_linear", "lora", "fp8_weight_linear"]


def build_module(kind: str, in_f: int, out_f: int) -> torch.nn.Module:
    if kind == "linear":
        return fp8mp.nn.Linear(in_f, out_f)
    if kind == "conv1d":
        return fp8mp.nn.Conv1D(out_f, in_f)
    if kind == "layernorm":
        return fp8mp.nn.LayerNorm(in_f)
    if kind == "rmsnorm":
        return fp8mp.nn.RMSNorm(in_f)
    if kind == "layernorm_linear":
        module = fp8mp.nn.LayerNormLinear(in_f, out_f, normalization=random.choice(["LayerNorm", "RMSNorm"]))
        torch.nn.init.normal_(module.norm.weight, 1.0, 0.5)
        return module
    if kind == "lora":
        module = fp8mp.nn.LoRALinear(fp8mp.nn.Linear(in_f, out_f), rank=4, alpha=8.0)
        torch.nn.init.normal_(module.lora_B)  # zero at initialization: the update would add nothing
        return module
    module = fp8mp.nn.Linear(in_f, out_f, fp8_weight=True)
    module.freeze_weight()
    return module


def module_reference(kind: str, module, x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 out, tolerance) of `module` on x from its parameters: plain float64 math, or in FP8 each GEMM
    operand cast by current scaling from scratch (fp8mp's norm output, checked against float64 by the norm
    kinds, feeds LayerNormLinear's linear)."""
    if kind in ("layernorm", "rmsnorm"):
        x64 = x.double()
        want = (F.layer_norm(x64, x.shape[-1:], module.weight.double(), module.bias.double(), module.eps) if kind == "layernorm"
                else F.rms_norm(x64, x.shape[-1:], module.weight.double(), module.eps))
        return want, 1e-5 * want.abs().nan_to_num(0, 0, 0) + 1e-5
    if kind == "layernorm_linear":
        return module_reference("linear", module.linear, module.norm(x), fp8)
    if kind == "lora":
        base, base_tol = module_reference("linear", module.base, x, fp8)
        update = (x.double() @ module.lora_A.double().t() @ module.lora_B.double().t()) * module.scaling
        return base + update, base_tol + 1e-5 * (x.double().abs() @ module.lora_A.double().abs().t()
                                                 @ module.lora_B.double().abs().t()) * module.scaling + 1e-6
    if kind == "fp8_weight_linear":  # the stored FP8 weight, decoded exactly
        weight64 = module.weight_fp8.float().double() * module.weight_scale_inv.double()
        if fp8:
            return fp8_linear64(x, weight64, module.bias)
        out = x.double() @ weight64.float().double().t() + module.bias.double()
        return out, 1e-5 * (x.double().abs() @ weight64.abs().t()) + 1e-6
    weight = module.weight if kind == "linear" else module.weight.t()  # Conv1D's weight is [in, out]
    if fp8:
        return fp8_linear64(x, cast64(weight), module.bias)
    out = x.double() @ weight.double().t() + module.bias.double()
    return out, 1e-5 * (x.double().abs() @ weight.double().abs().t()) + 1e-6 + 1e-6 * out.abs().nan_to_num(0, 0, 0)


@fuzz_target
def fuzz_modules(data):
    draw = data.draw
    in_f, out_f = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 48]))
    kind = draw(st.sampled_from(MODULE_KINDS))
    torch.manual_seed(draw(st.integers(0, 3)))
    random.seed(draw(st.integers(0, 3)))
    module = build_module(kind, in_f, out_f)
    rows = draw(st.lists(st.integers(0, 4), min_size=1, max_size=2))
    x = draw(laid_out(draw(floats_tensor([*rows, in_f], torch.float32, finite_max=1e3))))
    if draw(st.booleans()) and x.numel() and kind in ("linear", "conv1d", "fp8_weight_linear"):
        x = x.clone(memory_format=torch.contiguous_format)
        x.view(-1)[0] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    fp8 = kind not in ("layernorm", "rmsnorm") and draw(st.booleans())
    meta = draw(st.booleans()) and kind != "fp8_weight_linear"  # the whole module on the meta device: shapes only
    args = {"input": x}
    # Bad inputs in FP8, where fp8mp checks them (outside FP8 a Linear is torch's F.linear, with torch's errors).
    bad = corrupt(draw, args, {"input": [x[..., :-1], x.to(torch.int64)]}) if fp8 and not meta else None
    recipe = fp8mp.recipe.CurrentScaling(fp8_format=fp8mp.recipe.Format.E4M3)
    if meta:
        module, args = module.to("meta"), {"input": x.to("meta")}
    with fp8mp.fp8_autocast(enabled=fp8, fp8_recipe=recipe), torch.no_grad():
        out = call(kind + (" in fp8" if fp8 else "") + (" on meta" if meta else ""), module, args, bad)
    if out is None:
        return
    out_features = in_f if kind in ("layernorm", "rmsnorm") else out_f
    assert out.shape == (*x.shape[:-1], out_features) and out.dtype == torch.float32
    if meta:
        assert out.device.type == "meta"
        return
    if kind == "linear" and not fp8:
        torch.testing.assert_close(out, F.linear(x, module.weight, module.bias), rtol=0, atol=0, equal_nan=True)  # exactly nn.Linear
        return
    with torch.no_grad():
        want, tol = module_reference(kind, module, x, fp8)
    assert_close64(out, want, tol)


@fuzz_target
def fuzz_grouped_linear(data):
    """fp8mp.nn.GroupedLinear, forward and backward, in and out of FP8 (on meta: shapes only), against float64
    per expert: every FP8 operand cast by current scaling from scratch, the weights one scale per expert."""
    draw = data.draw
    in_f, out_f = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 48]))
    splits = draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    torch.manual_seed(draw(st.integers(0, 3)))
    module = fp8mp.nn.GroupedLinear(len(splits), in_f, out_f, bias=draw(st.booleans()))
    x = draw(laid_out(draw(floats_tensor([sum(splits), in_f], torch.float32, finite_max=1e3))))
    special = draw(st.booleans()) and x.numel() > 0
    if special:
        x = x.clone(memory_format=torch.contiguous_format)
        x.view(-1)[0] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    fp8, meta = draw(st.booleans()), draw(st.booleans())
    args = {"inp": x, "m_splits": splits}
    bad = None if meta else corrupt(draw, args, {"m_splits": [[*splits, 0], [s + 1 for s in splits],
                                                             [-1, *splits[1:]] if splits[0] == 0 else [-1] * len(splits)],
                                                 "inp": [x[:, :-1], x.to(torch.int64)] if fp8 else [x[:, :-1]]})
    if meta:
        module, args = module.to("meta"), {"inp": x.to("meta"), "m_splits": splits}
    grad = not meta and not special and bad is None
    if grad:
        args["inp"] = x = x.detach().clone().requires_grad_()
    recipe = fp8mp.recipe.CurrentScaling(fp8_format=fp8mp.recipe.Format.E4M3)
    with fp8mp.fp8_autocast(enabled=fp8, fp8_recipe=recipe), torch.set_grad_enabled(grad):
        out = call("GroupedLinear" + (" in fp8" if fp8 else "") + (" on meta" if meta else ""), module, args, bad)
    if out is None:
        return
    assert out.shape == (sum(splits), out_f) and out.dtype == torch.float32
    if meta:
        assert out.device.type == "meta"
        return
    weights = [cast64(w) if fp8 else w.double() for w in module.weight.detach()]
    x64 = cast64(x.detach()) if fp8 else x.detach().double()
    rows = [slice(end - size, end) for size, end in zip(splits, torch.tensor(splits).cumsum(0).tolist())]
    bias = module.bias.detach().double() if module.bias is not None else torch.zeros(len(splits), out_f, dtype=torch.float64)
    want = torch.cat([x64[r] @ w.t() + bias[g] for g, (r, w) in enumerate(zip(rows, weights))])
    tol = torch.cat([1e-5 * (x64[r].abs() @ w.abs().t()) for r, w in zip(rows, weights)]) + 1e-6 + 1e-6 * want.abs().nan_to_num(0, 0, 0)
    assert_close64(out, want.float().double(), tol)
    if not grad:
        return
    grad_out = draw(floats_tensor([sum(splits), out_f], torch.float32, finite_max=1e3))
    out.backward(grad_out)
    g64 = cast64(grad_out) if fp8 else grad_out.double()
    want_dx = torch.cat([g64[r] @ w for r, w in zip(rows, weights)])
    tol_dx = torch.cat([1e-5 * (g64[r].abs() @ w.abs()) for r, w in zip(rows, weights)]) + 1e-6 + 1e-6 * want_dx.abs()
    assert_close64(x.grad, want_dx.float().double(), tol_dx)
    for g, r in enumerate(rows):
        want_dw = g64[r].t() @ x64[r]
        assert_close64(module.weight.grad[g], want_dw.float().double(),
                       1e-5 * (g64[r].abs().t() @ x64[r].abs()) + 1e-6 + 1e-6 * want_dw.abs())


# name -> (target, the schema ops it calls)
TARGETS = {
    "cast": (fuzz_cast, {"cast_to_fp8", "cast_to_fp8_transpose"}),
    "cast_dbias": (fuzz_cast_dbias, {"cast_to_fp8_transpose_dbias"}),
    "cast_from_fp8": (fuzz_cast_from_fp8, {"cast_from_fp8"}),
    "gemm": (fuzz_gemm, {"fp8_gemm"}),
    "norm": (fuzz_norm, {"layernorm_fwd", "layernorm_fwd_fp8", "rmsnorm_fwd", "rmsnorm_fwd_fp8"}),
    "norm_bwd": (fuzz_norm_bwd, {"layernorm_bwd", "rmsnorm_bwd"}),
    "scale_update": (fuzz_scale_update, {"update_amax_history_and_scale"}),
    "block_quantize": (fuzz_block_quantize, {"block_quantize"}),
    "block_quantize_transpose": (fuzz_block_quantize_transpose, {"block_quantize_transpose"}),
    "norm_fwd_block_fp8": (fuzz_norm_fwd_block_fp8, {"norm_fwd_block_fp8"}),
    "block_scaled_gemm": (fuzz_block_scaled_gemm, {"block_scaled_gemm"}),
    "grouped_gemm": (fuzz_grouped_gemm, {"fp8_grouped_gemm"}),
    "grouped_gemm_wgrad": (fuzz_grouped_gemm_wgrad, {"fp8_grouped_gemm_wgrad"}),
    "block_scaled_grouped_gemm": (fuzz_block_scaled_grouped_gemm, {"block_scaled_grouped_gemm"}),
    "block_scaled_grouped_gemm_wgrad": (fuzz_block_scaled_grouped_gemm_wgrad, {"block_scaled_grouped_gemm_wgrad"}),
    "adamw_step": (fuzz_adamw_step, {"adamw_step"}),
    "lion_step": (fuzz_lion_step, {"lion_step"}),
    "modules": (fuzz_modules, set()),
    "grouped_linear": (fuzz_grouped_linear, {"fp8_grouped_gemm", "fp8_grouped_gemm_wgrad"}),
}


def crash() -> None:
    """--crash: a call that kills the process (how tests/test_fuzz.py checks that it reports the input)."""
    print("CALL", "os.abort", {"x": describe(torch.tensor([1.5, math.nan]))}, "bad:", None, flush=True)
    os.abort()


if __name__ == "__main__":
    if "--list" in sys.argv:
        for name, (_, covered) in TARGETS.items():
            print(name, *sorted(covered))
        sys.exit(0)
    torch.set_num_threads(1)
    print("SEED", SEED, flush=True)
    if "--crash" in sys.argv:
        crash()
    chosen = [a for a in sys.argv[2:] if not a.startswith("--")] or list(TARGETS)
    for name in chosen:
        print("TARGET", name, flush=True)
        TARGETS[name][0]()
    print("DONE", flush=True)
