"""Property-based fuzz of every fp8mp op and of the modules, run in a subprocess by tests/test_fuzz.py.

    FP8MP_FUZZ_SEED=1234 python tests/fuzz_worker.py EXAMPLES_PER_TARGET    (seed: random unless given)

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
from fp8_reference import FP8_DTYPES, FP8_MAX, is_nan_code, saturate  # noqa: E402

ops = torch.ops.fp8mp
HIGH = [torch.float32, torch.bfloat16, torch.float16]
BAD_DTYPES = [torch.float64, torch.int32, torch.float8_e4m3fn]
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
EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 100
SEED = int(os.environ.get("FP8MP_FUZZ_SEED", random.randrange(1 << 32)))  # printed first: a run can be replayed
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@seed(SEED)
@SETTINGS
@given(st.data())
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


@seed(SEED)
@SETTINGS
@given(st.data())
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
    assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out[~out.isnan()], want[~want.isnan()])


@seed(SEED)
@SETTINGS
@given(st.data())
def fuzz_gemm(data):
    draw = data.draw
    m, k, n = draw(st.integers(0, 9)), draw(st.integers(0, 20)), draw(st.integers(0, 9))
    fa, fb = draw(st.sampled_from([("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]))
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
    a64, b64 = a.float().double(), b.float().double()
    scale = float(sa) * float(sb)
    want = (a64 @ b64.t()) * scale + (bias.double() if bias is not None else 0.0)
    abs_sum = (a64.abs() @ b64.abs().t()) * scale + (bias.double().abs() if bias is not None else 0.0)
    info = torch.finfo(out_dtype)
    tol = info.eps * want.abs().nan_to_num(0, 0, 0) + info.tiny + 1e-5 * abs_sum.nan_to_num(0, 0, 0)
    assert out.shape == (m, n) and out.dtype == out_dtype
    # Where a NaN or Inf code meets the sum, the fp32 result is non-finite exactly where float64's is;
    # past out_dtype's range the rounding overflows to Inf.
    top = torch.tensor(info.max, dtype=out_dtype)
    overflow = info.max + (info.max - torch.nextafter(top, torch.zeros_like(top)).item()) / 2  # rounds to Inf from here
    want = torch.where(want.abs() >= overflow, want.sign() * math.inf, want)
    assert_close64(out, want, tol)


@seed(SEED)
@SETTINGS
@given(st.data())
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


@seed(SEED)
@SETTINGS
@given(st.data())
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


# ----------------------------------------------------------------------------- modules
@seed(SEED)
@SETTINGS
@given(st.data())
def fuzz_modules(data):
    draw = data.draw
    in_f, out_f = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 48]))
    torch.manual_seed(draw(st.integers(0, 3)))
    kind = draw(st.sampled_from(["linear", "layernorm", "rmsnorm"]))
    module = {"linear": lambda: fp8mp.nn.Linear(in_f, out_f), "layernorm": lambda: fp8mp.nn.LayerNorm(in_f),
              "rmsnorm": lambda: fp8mp.nn.RMSNorm(in_f)}[kind]()
    rows = draw(st.lists(st.integers(0, 4), min_size=1, max_size=2))
    x = draw(laid_out(draw(floats_tensor([*rows, in_f], torch.float32, finite_max=1e3))))
    if draw(st.booleans()) and x.numel() and kind == "linear":
        x = x.clone(memory_format=torch.contiguous_format)
        x.view(-1)[0] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    fp8 = kind == "linear" and draw(st.booleans())
    args = {"input": x}
    # Bad inputs in FP8, where fp8mp checks them (outside FP8 a Linear is torch's F.linear, with torch's errors).
    bad = corrupt(draw, args, {"input": [x[..., :-1], x.to(torch.int64), x.to("meta")]}) if fp8 else None
    recipe = fp8mp.recipe.CurrentScaling(fp8_format=fp8mp.recipe.Format.E4M3)
    with fp8mp.fp8_autocast(enabled=fp8, fp8_recipe=recipe), torch.no_grad():
        out = call(kind + (" in fp8" if fp8 else ""), module, args, bad)
    if out is None:
        return
    if kind != "linear":
        want = (F.layer_norm(x.double(), (in_f,), module.weight.double(), module.bias.double(), module.eps) if kind == "layernorm"
                else F.rms_norm(x.double(), (in_f,), module.weight.double(), module.eps))
        assert_close64(out, want, 1e-5 * want.abs().nan_to_num(0, 0, 0) + 1e-5)
        return
    if not fp8:
        torch.testing.assert_close(out, F.linear(x, module.weight, module.bias), rtol=0, atol=0, equal_nan=True)  # exactly nn.Linear
        return
    # Current scaling from scratch: scale = 448 / amax where amax is finite and > 0, else the initial 1.
    def cast64(t):
        amax = t.float().abs().max() if t.numel() else torch.tensor(0.0)
        s = 448.0 / amax if bool(amax.isfinite() & (amax > 0) & (448.0 / amax).isfinite() & (448.0 / amax > 0)) else torch.tensor(1.0)
        return saturate(t.float() * s, "e4m3").to(torch.float8_e4m3fn).float().double() / s.double()
    want = cast64(x).reshape(-1, in_f) @ cast64(module.weight).t() + module.bias.double()
    want = want.reshape(*x.shape[:-1], out_f).float().double()
    assert_close64(out, want, 1e-5 * (cast64(x).abs().reshape(-1, in_f) @ cast64(module.weight).abs().t()
                                       ).reshape(want.shape) + 1e-6 + 1e-6 * want.abs().nan_to_num(0, 0, 0))


def crash() -> None:
    """--crash: a call that kills the process (how tests/test_fuzz.py checks that it reports the input)."""
    print("CALL", "os.abort", {"x": describe(torch.tensor([1.5, math.nan]))}, "bad:", None, flush=True)
    os.abort()


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("SEED", SEED, flush=True)
    if "--crash" in sys.argv:
        crash()
    for target in (fuzz_cast, fuzz_cast_from_fp8, fuzz_gemm, fuzz_norm, fuzz_scale_update, fuzz_modules):
        print("TARGET", target.__name__, flush=True)
        target()
    print("DONE", flush=True)
