"""Fake kernels refuse what the real kernels refuse, with the same exception and message.

Each bad call below runs three ways: eagerly on CPU (the C++ checks), with every tensor on the meta
device (the fake kernel, which the dispatcher picks for meta tensors) and under FakeTensorMode (as
torch.compile traces). The three errors must be equal. A meta tensor mixed with CPU tensors also goes
to the fake kernel, which must refuse it like a tensor on any other wrong device.
"""
from __future__ import annotations

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fp8mp  # noqa: F401  (registers the ops)
from opcheck_util import error_of

ops = torch.ops.fp8mp
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def t(*shape, dtype=torch.float32, dev="cpu"):
    return torch.ones(shape, dtype=dtype, device=dev)


def one(dev, dtype=torch.float32):
    return t(1, dtype=dtype, dev=dev)


def gemm(dev, a=None, b=None, a_si=None, b_si=None, bias=None, out_dtype=torch.bfloat16):
    a = a if a is not None else t(4, 8, dtype=E4M3, dev=dev)
    b = b if b is not None else t(3, 8, dtype=E4M3, dev=dev)
    return ops.fp8_gemm(a, a_si if a_si is not None else one(dev), b, b_si if b_si is not None else one(dev), bias, out_dtype)


def scaling(dev, amax=None, history=None, scale=None, scale_inv=None, fp8_max=None, margin=0, algo="max"):
    args = [amax if amax is not None else t(3, dev=dev), history if history is not None else t(4, 3, dev=dev),
            scale if scale is not None else t(3, dev=dev), scale_inv if scale_inv is not None else t(3, dev=dev),
            fp8_max if fp8_max is not None else t(3, dev=dev)]
    ops.update_amax_history_and_scale(*args, margin, algo)


def shared_scale(dev):
    scale = t(3, dev=dev)
    scaling(dev, scale=scale, scale_inv=scale)


BAD_CALLS = {
    "cast fmt": lambda d: ops.cast_to_fp8(t(4, dev=d), one(d), one(d), "e3m4"),
    "cast x dtype": lambda d: ops.cast_to_fp8(t(4, dtype=torch.float64, dev=d), one(d), one(d), "e4m3"),
    "cast scale dtype": lambda d: ops.cast_to_fp8(t(4, dev=d), one(d, torch.float64), one(d), "e4m3"),
    "cast scale shape": lambda d: ops.cast_to_fp8(t(4, dev=d), t(2, 1, dev=d), one(d), "e4m3"),
    "cast amax dtype": lambda d: ops.cast_to_fp8(t(4, dev=d), one(d), one(d, torch.int32), "E5M2"),
    "cast amax empty": lambda d: ops.cast_to_fp8(t(4, dev=d), one(d), t(0, dev=d), "e4m3"),
    "transpose 3-D": lambda d: ops.cast_to_fp8_transpose(t(2, 3, 4, dev=d), one(d), one(d), "e4m3"),
    "transpose 1-D": lambda d: ops.cast_to_fp8_transpose(t(5, dev=d), one(d), one(d), "e4m3"),
    "dbias 3-D": lambda d: ops.cast_to_fp8_transpose_dbias(t(2, 3, 4, dev=d), one(d), one(d), "e4m3"),
    "dbias x dtype": lambda d: ops.cast_to_fp8_transpose_dbias(t(2, 3, dtype=torch.int32, dev=d), one(d), one(d), "e4m3"),
    "dbias fmt": lambda d: ops.cast_to_fp8_transpose_dbias(t(2, 3, dev=d), one(d), one(d), "e3m4"),
    "decode y dtype": lambda d: ops.cast_from_fp8(t(4, dev=d), one(d), torch.float32),
    "decode scale_inv": lambda d: ops.cast_from_fp8(t(4, dtype=E4M3, dev=d), t(0, dev=d), torch.float32),
    "decode out_dtype": lambda d: ops.cast_from_fp8(t(4, dtype=E5M2, dev=d), one(d), torch.int32),
    "gemm a dtype": lambda d: gemm(d, a=t(4, 8, dev=d)),
    "gemm e5m2 x e5m2": lambda d: gemm(d, a=t(4, 8, dtype=E5M2, dev=d), b=t(3, 8, dtype=E5M2, dev=d)),
    "gemm scale dtype": lambda d: gemm(d, b_si=one(d, torch.float64)),
    "gemm out_dtype": lambda d: gemm(d, out_dtype=torch.float64),
    "gemm a 3-D": lambda d: gemm(d, a=t(2, 4, 8, dtype=E4M3, dev=d)),
    "gemm K": lambda d: gemm(d, b=t(3, 7, dtype=E4M3, dev=d)),
    "gemm bias dtype": lambda d: gemm(d, bias=t(3, dev=d)),
    "gemm bias shape": lambda d: gemm(d, bias=t(4, dtype=torch.bfloat16, dev=d)),
    "layernorm x dtype": lambda d: ops.layernorm_fwd(t(2, 4, dtype=torch.int32, dev=d), None, None, 1e-5, False),
    "layernorm empty H": lambda d: ops.layernorm_fwd(t(2, 0, dev=d), None, None, 1e-5, False),
    "layernorm 0-D": lambda d: ops.layernorm_fwd(t(dev=d), None, None, 1e-5, False),
    "layernorm weight shape": lambda d: ops.layernorm_fwd(t(2, 4, dev=d), t(3, dev=d), None, 1e-5, False),
    "layernorm weight dtype": lambda d: ops.layernorm_fwd(t(2, 4, dev=d), t(4, dtype=torch.float64, dev=d), None, 1e-5, False),
    "layernorm bias dtype": lambda d: ops.layernorm_fwd(t(2, 4, dev=d), t(4, dev=d), t(4, dtype=torch.bfloat16, dev=d), 1e-5, False),
    "layernorm eps 0": lambda d: ops.layernorm_fwd(t(2, 4, dev=d), None, None, 0.0, False),
    "layernorm eps nan": lambda d: ops.layernorm_fwd(t(2, 4, dev=d), None, None, float("nan"), False),
    "layernorm eps fp32 0": lambda d: ops.layernorm_fwd(t(2, 4, dev=d), None, None, 1e-50, False),
    "layernorm eps fp32 inf": lambda d: ops.layernorm_fwd(t(2, 4, dev=d), None, None, 1e39, False),
    "layernorm_fp8 scale": lambda d: ops.layernorm_fwd_fp8(t(2, 4, dev=d), None, None, 1e-5, False, t(2, dev=d), one(d), "e4m3"),
    "layernorm_fp8 fmt": lambda d: ops.layernorm_fwd_fp8(t(2, 4, dev=d), None, None, 1e-5, False, one(d), one(d), "fp8"),
    "layernorm_bwd grad shape": lambda d: ops.layernorm_bwd(t(2, 3, dev=d), t(2, 4, dev=d), t(2, dev=d), t(2, dev=d), None, False),
    "layernorm_bwd grad dtype": lambda d: ops.layernorm_bwd(t(2, 4, dtype=torch.bfloat16, dev=d), t(2, 4, dev=d), t(2, dev=d),
                                                            t(2, dev=d), None, False),
    "layernorm_bwd mean dtype": lambda d: ops.layernorm_bwd(t(2, 4, dev=d), t(2, 4, dev=d), t(2, dtype=torch.float16, dev=d),
                                                            t(2, dev=d), None, False),
    "layernorm_bwd rstd shape": lambda d: ops.layernorm_bwd(t(2, 4, dev=d), t(2, 4, dev=d), t(2, dev=d), t(2, 1, dev=d), None, False),
    "rmsnorm weight shape": lambda d: ops.rmsnorm_fwd(t(2, 4, dev=d), t(4, 1, dev=d), 1e-6, False),
    "rmsnorm_fp8 amax": lambda d: ops.rmsnorm_fwd_fp8(t(2, 4, dev=d), None, 1e-6, False, one(d), one(d, torch.bfloat16), "e4m3"),
    "rmsnorm_bwd rstd": lambda d: ops.rmsnorm_bwd(t(2, 4, dev=d), t(2, 4, dev=d), t(3, dev=d), None, False),
    "scaling amax dtype": lambda d: scaling(d, amax=t(3, dtype=torch.float64, dev=d)),
    "scaling amax 2-D": lambda d: scaling(d, amax=t(3, 1, dev=d)),
    "scaling history shape": lambda d: scaling(d, history=t(4, 2, dev=d)),
    "scaling history empty": lambda d: scaling(d, history=t(0, 3, dev=d)),
    "scaling scale shape": lambda d: scaling(d, scale=t(2, dev=d)),
    "scaling history layout": lambda d: scaling(d, history=t(3, 4, dev=d).t()),
    "scaling shared buffers": shared_scale,
    "scaling margin": lambda d: scaling(d, margin=-1),
    "scaling algo": lambda d: scaling(d, algo="mean"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_fake_kernels_refuse_what_the_cpu_kernels_refuse_with_the_same_error(name):
    eager = error_of(BAD_CALLS[name], "cpu")
    # Names the op and the argument (after the tag of fp8mp's ValueError contract, fp8mp/ops/errors.py).
    assert re.search(r"^(\[ValueError\] )?fp8mp::\w+: argument[s]? '\w+'", eager[1]), eager
    assert error_of(BAD_CALLS[name], "meta") == eager
    assert error_of(BAD_CALLS[name], "fake") == eager


@pytest.mark.parametrize("call, arg", [
    (lambda: ops.cast_to_fp8(t(4), one("meta"), one("cpu"), "e4m3"), "scale"),
    (lambda: ops.cast_to_fp8_transpose(t(2, 4), one("cpu"), one("meta"), "e4m3"), "amax"),
    (lambda: ops.cast_from_fp8(t(4, dtype=E4M3), one("meta"), torch.float32), "scale_inv"),
    (lambda: gemm("cpu", a_si=one("meta")), "a_scale_inv"),
    (lambda: ops.layernorm_fwd(t(2, 4), t(4, dev="meta"), None, 1e-5, False), "weight"),
    (lambda: ops.rmsnorm_bwd(t(2, 4), t(2, 4), t(2, dev="meta"), None, False), "rstd"),
])
def test_a_meta_argument_beside_cpu_tensors_is_refused_naming_it(call, arg):
    with pytest.raises(RuntimeError, match=rf"argument '{arg}' must be on the input's device cpu, got meta"):
        call()


def test_scaling_ops_meta_argument_is_refused():
    with pytest.raises(RuntimeError, match=r"argument 'scale_inv' must be on amax's device cpu, got meta"):
        scaling("cpu", scale_inv=t(3, dev="meta"))


# Outputs written in place must not overlap what the op reads: the fake kernels refuse it like the C++ kernels.
def overlapping_amax(call):
    def run(dev):
        buffer = t(8, dev=dev)
        call(dev, buffer)
    return run


OVERLAPS = {
    "cast amax in x": (overlapping_amax(lambda d, b: ops.cast_to_fp8(b, one(d), b[3:4], "e4m3")), "amax", "x"),
    "cast amax is scale": (overlapping_amax(lambda d, b: ops.cast_to_fp8(t(4, dev=d), b[:1], b[:1], "e4m3")), "amax", "scale"),
    "transpose amax in x": (overlapping_amax(lambda d, b: ops.cast_to_fp8_transpose(b.view(2, 4).t(), one(d), b[7:], "e5m2")),
                            "amax", "x"),
    "layernorm_fp8 amax in weight": (overlapping_amax(
        lambda d, b: ops.layernorm_fwd_fp8(t(2, 4, dev=d), b[:4], None, 1e-5, False, one(d), b[2:3], "e4m3")), "amax", "weight"),
    "rmsnorm_fp8 amax in x": (overlapping_amax(
        lambda d, b: ops.rmsnorm_fwd_fp8(b.view(2, 4), None, 1e-6, False, one(d), b[5:6], "e4m3")), "amax", "x"),
}


@pytest.mark.parametrize("name", list(OVERLAPS))
@pytest.mark.parametrize("device", ["meta", "fake"])
def test_fake_kernels_refuse_an_amax_overlapping_an_input(name, device):
    call, out, other = OVERLAPS[name]
    kind, message = error_of(call, device)
    assert kind is RuntimeError
    assert message.endswith(f": argument '{out}' is written in place and must not share memory with '{other}'")


@pytest.mark.parametrize("name", list(OVERLAPS))
def test_cpu_kernels_refuse_an_overlapping_amax_like_the_fake_kernels(name):
    call = OVERLAPS[name][0]
    assert error_of(call, "cpu") == error_of(call, "meta")


def test_disjoint_views_of_one_buffer_are_accepted():
    buffer = t(9)
    x, scale, amax = buffer[:4], buffer[4:5], buffer[8:9]  # one storage, no shared bytes
    for device_args in ((x, scale, amax), tuple(a.to("meta") for a in (x, scale, amax))):
        ops.cast_to_fp8(*device_args, "e4m3")
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(buffer)
        ops.cast_to_fp8(fake[:4], fake[4:5], fake[8:9], "e4m3")


def test_compiled_call_gives_the_eager_error():
    def bad_scale(x, scale, amax):
        return ops.cast_to_fp8(x, scale, amax, "e4m3")

    x, amax = t(4), one("cpu")
    scale = one("cpu", torch.float64)
    eager = error_of(lambda d: bad_scale(x, scale, amax), "cpu")
    compiled = torch.compile(bad_scale, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception) as info:
        compiled(x, scale, amax)
    assert eager[1] in str(info.value)
