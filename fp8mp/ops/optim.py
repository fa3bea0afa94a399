"""Fused optimizer steps: the fake kernels, argument checks and wrappers of ``adamw_step`` and ``lion_step``.

Declared in csrc/ops.cpp, implemented in csrc/optim/ (optim_rule.h holds the arithmetic both devices share;
optim_checks.cpp the checks mirrored here for the fakes). Each op updates one parameter in place, reading
parameter, gradient and states once and writing them once:

* states are float32, bfloat16 or float8_e4m3fn with one float32 scale per :data:`STATE_BLOCK` contiguous
  elements (``value = float(code) * scale[block]``, scale = block amax / 448); bfloat16 and FP8 states are
  rounded stochastically (an EMA step smaller than the format's spacing, AdamW's v at beta2 = 0.999, would
  freeze under nearest rounding); AdamW's ``exp_avg_sq`` in FP8 holds ``sqrt(v)`` (its range is m's, v's is
  twice that). benchmarks/sqnr_optimizer_states.py measured both choices against an fp64 AdamW;
* a bfloat16 parameter is rounded stochastically with 16 random bits per element hashed from
  ``(seed, step, element_offset + element index)``, the same on CPU and CUDA and after a resume; a float32
  parameter is written with the update rounded once per operation (no stochastic rounding);
* ``element_offset`` (default 0) is the index of the tensor's first element in a larger one it is a shard of
  (FSDP2's dim-0 shards; fp8mp/optim/sharding.py): the shard then draws the random bits of the same
  elements of the whole tensor, and with FP8 states, where it must be a multiple of :data:`STATE_BLOCK`, its
  blocks are the whole tensor's, so a step of the shards writes the bits of the step of the whole;
* ``step`` (1-element int64 on the parameter's device) is the count of steps taken, incremented by the op;
  the bias corrections use it, so it is the stochastic-rounding counter too;
* ``found_inf`` (optional 1-element float32 on the device): when nonzero nothing at all is written, not even
  ``step`` (the whole step is skipped, read on the device without a host sync);
* a NaN is written with fixed bits on both devices: float32 0x7FC00000, bfloat16 0x7FC0, E4M3 code 0x7F, and
  the scale of a block holding a NaN 0x7FC00000.

On CPU the kernels run the blocks in parallel on torch's intra-op threads and vectorize each block (AVX-512,
AVX2 or baseline x86-64, chosen by the CPU); the bits written do not depend on either.
``FP8MP_CPU_OPTIM=scalar`` in the environment (read once per process) runs one element at a time instead, the
same bits more slowly: tests/optim/test_optim_cpu_paths.py compares the two.
"""
from __future__ import annotations

import torch

from fp8mp.ops import native  # noqa: F401  (loads the libraries and their registrations)
from fp8mp.ops.checks import _require, dtype_name, shares_memory, sizes
from fp8mp.ops.errors import raising_value_errors

__all__ = ["STATE_BLOCK", "STATE_DTYPES", "adamw_step", "lion_step", "state_scale_numel"]

STATE_BLOCK = 128  # optim::kStateBlock
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn)
PARAM_DTYPES = (torch.float32, torch.bfloat16)


def state_scale_numel(numel: int) -> int:
    """The number of FP8 block scales of a state of `numel` elements."""
    return (numel + STATE_BLOCK - 1) // STATE_BLOCK


def _check_on_param_device(t, param, op, name) -> None:
    _require(t.layout == torch.strided, RuntimeError, f"{op}: argument '{name}' must be a strided tensor")
    _require(t.device == param.device, RuntimeError,
             f"{op}: argument '{name}' must be on param's device {param.device}, got {t.device}")


def _check_contiguous(t, op, name) -> None:
    _require(t.is_contiguous(), RuntimeError, f"{op}: argument '{name}' must be contiguous")


def _check_step_buffers(op, param, grad, states, step, found_inf, element_offset) -> None:
    """optim_checks.cpp's check_optimizer_step_args; `states` is [(state, name, scale, scale_name)]."""
    _require(param.dtype in PARAM_DTYPES, RuntimeError,
             f"{op}: argument 'param' must be float32 or bfloat16, got {dtype_name(param.dtype)}")
    _require(param.layout == torch.strided, RuntimeError, f"{op}: argument 'param' must be a strided tensor")
    _check_contiguous(param, op, "param")
    _require(grad.dtype in PARAM_DTYPES, RuntimeError,
             f"{op}: argument 'grad' must be float32 or bfloat16, got {dtype_name(grad.dtype)}")
    _check_on_param_device(grad, param, op, "grad")
    _require(grad.shape == param.shape, ValueError,
             f"{op}: argument 'grad' must have param's shape {sizes(param)}, got {sizes(grad)}")
    _check_contiguous(grad, op, "grad")
    blocks = state_scale_numel(param.numel())
    first_dtype, first_name = states[0][0].dtype, states[0][1]
    for state, name, scale, scale_name in states:
        _require(state.dtype in STATE_DTYPES, RuntimeError,
                 f"{op}: argument '{name}' must be float32, bfloat16 or float8_e4m3fn, got {dtype_name(state.dtype)}")
        _require(state.dtype == first_dtype, RuntimeError,
                 f"{op}: argument '{name}' must have the dtype of '{first_name}' ({dtype_name(first_dtype)}), "
                 f"got {dtype_name(state.dtype)}")
        _check_on_param_device(state, param, op, name)
        _require(state.shape == param.shape, ValueError,
                 f"{op}: argument '{name}' must have param's shape {sizes(param)}, got {sizes(state)}")
        _check_contiguous(state, op, name)
        if state.dtype == torch.float8_e4m3fn:
            _require(scale is not None, ValueError,
                     f"{op}: argument '{scale_name}' is required when '{name}' is float8_e4m3fn")
            _require(scale.dtype == torch.float32, RuntimeError,
                     f"{op}: argument '{scale_name}' must be float32, got {dtype_name(scale.dtype)}")
            _check_on_param_device(scale, param, op, scale_name)
            _require(scale.dim() == 1 and scale.shape[0] == blocks, ValueError,
                     f"{op}: argument '{scale_name}' must have shape [{blocks}] (one scale per {STATE_BLOCK} "
                     f"elements of param), got {sizes(scale)}")
            _check_contiguous(scale, op, scale_name)
        else:
            _require(scale is None, ValueError,
                     f"{op}: argument '{scale_name}' must be None when '{name}' is {dtype_name(state.dtype)}")
    _require(0 <= element_offset <= 2**63 - 1 - param.numel(), ValueError,
             f"{op}: argument 'element_offset' must be >= 0 with element_offset + numel within int64, "
             f"got {element_offset}")
    _require(first_dtype != torch.float8_e4m3fn or element_offset % STATE_BLOCK == 0, ValueError,
             f"{op}: argument 'element_offset' must be a multiple of {STATE_BLOCK} when the states are "
             f"float8_e4m3fn (their blocks are the whole tensor's), got {element_offset}")
    _require(step.dtype == torch.int64, RuntimeError,
             f"{op}: argument 'step' must be a 1-element int64 tensor, got dtype {dtype_name(step.dtype)}")
    _require(step.numel() == 1, ValueError, f"{op}: argument 'step' must be a 1-element int64 tensor, got shape {sizes(step)}")
    _check_on_param_device(step, param, op, "step")
    if found_inf is not None:
        _require(found_inf.dtype == torch.float32, RuntimeError,
                 f"{op}: argument 'found_inf' must be a 1-element float32 tensor, got dtype {dtype_name(found_inf.dtype)}")
        _require(found_inf.numel() == 1, ValueError,
                 f"{op}: argument 'found_inf' must be a 1-element float32 tensor, got shape {sizes(found_inf)}")
        _check_on_param_device(found_inf, param, op, "found_inf")
    written = [(param, "param"), (step, "step")]
    everything = [(param, "param"), (grad, "grad"), (step, "step")]
    if found_inf is not None:
        everything.append((found_inf, "found_inf"))
    for state, name, scale, scale_name in states:
        written.append((state, name))
        everything.append((state, name))
        if scale is not None:
            written.append((scale, scale_name))
            everything.append((scale, scale_name))
    for out, out_name in written:
        for other, other_name in everything:
            if other_name != out_name:  # argument by argument, as the C++ compares its arguments, not their storage
                _require(not shares_memory(out, other), RuntimeError,
                         f"{op}: argument '{out_name}' is written in place and must not share memory with '{other_name}'")


def _check_range(ok, op, name, allowed, value) -> None:
    _require(ok, ValueError, f"{op}: argument '{name}' must be {allowed}, got {value:g}")


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def check_adamw_step_args(param, grad, exp_avg, exp_avg_scale, exp_avg_sq, exp_avg_sq_scale, step, found_inf, lr,
                          beta1, beta2, eps, weight_decay, seed, element_offset=0) -> None:
    op = "fp8mp::adamw_step"
    _check_step_buffers(op, param, grad, [(exp_avg, "exp_avg", exp_avg_scale, "exp_avg_scale"),
                                          (exp_avg_sq, "exp_avg_sq", exp_avg_sq_scale, "exp_avg_sq_scale")],
                        step, found_inf, element_offset)
    _check_range(_finite(lr) and lr >= 0, op, "lr", "finite and >= 0", lr)
    _check_range(0 <= beta1 < 1, op, "beta1", "in [0, 1)", beta1)
    _check_range(0 <= beta2 < 1, op, "beta2", "in [0, 1)", beta2)
    _check_range(_finite(eps) and eps > 0, op, "eps", "finite and > 0", eps)
    _check_range(_finite(weight_decay) and weight_decay >= 0, op, "weight_decay", "finite and >= 0", weight_decay)


def check_lion_step_args(param, grad, exp_avg, exp_avg_scale, step, found_inf, lr, beta1, beta2, weight_decay,
                         seed, element_offset=0) -> None:
    op = "fp8mp::lion_step"
    _check_step_buffers(op, param, grad, [(exp_avg, "exp_avg", exp_avg_scale, "exp_avg_scale")], step, found_inf,
                        element_offset)
    _check_range(_finite(lr) and lr >= 0, op, "lr", "finite and >= 0", lr)
    _check_range(0 <= beta1 <= 1, op, "beta1", "in [0, 1]", beta1)
    _check_range(0 <= beta2 <= 1, op, "beta2", "in [0, 1]", beta2)
    _check_range(_finite(weight_decay) and weight_decay >= 0, op, "weight_decay", "finite and >= 0", weight_decay)


@torch.library.register_fake("fp8mp::adamw_step")
def _adamw_step_fake(*args):
    # Only mutates its (a!)..(f!) arguments, which the schema declares.
    check_adamw_step_args(*args)


@torch.library.register_fake("fp8mp::lion_step")
def _lion_step_fake(*args):
    check_lion_step_args(*args)


@raising_value_errors
def adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_scale: torch.Tensor | None,
               exp_avg_sq: torch.Tensor, exp_avg_sq_scale: torch.Tensor | None, step: torch.Tensor,
               found_inf: torch.Tensor | None, *, lr: float, beta1: float, beta2: float, eps: float,
               weight_decay: float, seed: int, element_offset: int = 0) -> None:
    """One AdamW step (decoupled weight decay, torch.optim.AdamW's formula) of one parameter, in place.

    With t = step + 1: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``p = p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``, in fp32 (bias
    corrections in fp64), then ``step = t``. See the module docstring for the state encodings, the rounding
    of the parameter and `found_inf`.

    Args:
        param: float32 or bfloat16, contiguous; updated in place.
        grad: float32 or bfloat16 of param's shape, contiguous.
        exp_avg, exp_avg_sq: the first moment and the second (as sqrt(v) when FP8) of param's shape, both
            float32, both bfloat16 or both float8_e4m3fn; updated in place.
        exp_avg_scale, exp_avg_sq_scale: float32 ``[ceil(numel / 128)]`` when the states are FP8, else None.
        step: 1-element int64, the steps taken so far; incremented.
        found_inf: None or a 1-element float32: nonzero skips the step entirely.
        lr, beta1, beta2, eps, weight_decay: lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0.
        seed: the stochastic-rounding stream of this parameter (any int64).
        element_offset: the index of param's first element in the whole tensor it is a shard of (>= 0, a
            multiple of 128 with FP8 states); 0 for a whole tensor.

    All tensors are on param's device; the written ones share no memory with any other argument.
    """
    torch.ops.fp8mp.adamw_step(param, grad, exp_avg, exp_avg_scale, exp_avg_sq, exp_avg_sq_scale, step, found_inf,
                               lr, beta1, beta2, eps, weight_decay, seed, element_offset)


@raising_value_errors
def lion_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_scale: torch.Tensor | None,
              step: torch.Tensor, found_inf: torch.Tensor | None, *, lr: float, beta1: float, beta2: float,
              weight_decay: float, seed: int, element_offset: int = 0) -> None:
    """One Lion step (Chen et al. 2023, decoupled weight decay) of one parameter, in place.

    ``p = p (1 - lr wd) - lr sign(b1 m + (1 - b1) g)``, ``m = b2 m + (1 - b2) g``, then ``step += 1``.
    Arguments as :func:`adamw_step` (betas in [0, 1]); exp_avg is the momentum m.
    """
    torch.ops.fp8mp.lion_step(param, grad, exp_avg, exp_avg_scale, step, found_inf, lr, beta1, beta2, weight_decay,
                              seed, element_offset)
