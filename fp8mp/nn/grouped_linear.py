"""`fp8mp.nn.GroupedLinear`: Transformer Engine's GroupedLinear, the experts of a mixture-of-experts layer.

`num_gemms` linear maps y_g = x_g @ W_g.T + b_g over the rows of one input sorted by group. One 3-D parameter
`weight` [num_gemms, out_features, in_features] (and `bias` [num_gemms, out_features]) holds every expert, rather
than Transformer Engine's `weight0` ... `weight{n-1}`: it is the grouped GEMM's operand as it is (no stacking
copy of every expert per step, no second copy of the gradients), the layout of transformers' experts
(`gate_up_proj` [E, 2I, H]), and it stays one plain tensor in the state_dict. Transformer Engine's per-GEMM
checkpoint keys load too (stacked into `weight` / `bias`).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from fp8mp.functions.grouped_linear import meta_grouped_linear
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.ops.format import HIGH_PRECISION_DTYPES
from fp8mp.scaling import autocast as autocast_state
from fp8mp.scaling.config_checks import check_int

__all__ = ["GroupedLinear"]

_NAME = "fp8mp.nn.GroupedLinear"
_FP8_ALIGN = 16  # the grouped GEMM's K and N (cuBLASLt's FP8 alignment)


class GroupedLinear(Fp8Module):
    """`num_gemms` linear layers over the row groups of one input, in FP8 inside `fp8mp.fp8_autocast`.

    ``GroupedLinear(num_gemms, in_features, out_features, bias=True, *, device=None, dtype=None)``, Transformer
    Engine's constructor; ``forward(inp, m_splits)`` with `inp` [..., in_features] whose rows (leading dimensions
    flattened) are sorted by group and `m_splits` the groups' row counts (a sequence of num_gemms ints >= 0, or a
    1-D integer tensor) summing to the row count; or ``forward(inp, offs=offs)`` with torch._grouped_mm's
    cumulative row ends (1-D integer tensor [num_gemms], non-decreasing, ending at the row count). Returns
    [..., out_features]. Both are read on the host (one sync for a tensor on a GPU): the high-precision path
    splits the rows by them.

    Outside fp8_autocast: exactly ``torch.cat([F.linear(x_g, weight[g], bias[g]) for each group g])`` in the
    parameters' precision. Inside, under the per-tensor recipes (DelayedScaling, CurrentScaling): the three GEMMs
    of fp8mp.ops.fp8_grouped_gemm / fp8_grouped_gemm_wgrad (E4M3 forward, the recipe's backward format for the
    gradient), the tokens and the output gradient scaled through this module's Fp8Meta (INPUT and GRAD columns,
    as fp8mp.nn.Linear's), each expert's weight by a current scale of its own (the WEIGHT column holds the
    largest expert amax). Under the fine-grained recipes (RowwiseScaling, BlockScaling, MXFP8Scaling) each group is
    computed as fp8mp.nn.Linear computes it on that group alone, bit for bit on CPU, forward and backward (the
    block GEMMs of fp8mp.ops.block_scaled_grouped_gemm and block_scaled_grouped_gemm_wgrad, blocks that never span
    two groups; see fp8mp.scaling.block_grouped), nothing read from or written to the Fp8Meta, as on Linear.
    in_features and out_features must be multiples of 16 in FP8. `fp8_recipe` and `fp8_fallback` work as on
    fp8mp.nn.Linear.
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True, *, device=None,
                 dtype=None):
        super().__init__()
        self.num_gemms = check_int(f"{_NAME}: argument 'num_gemms'", num_gemms, 1)
        self.in_features = check_int(f"{_NAME}: argument 'in_features'", in_features, 1)
        self.out_features = check_int(f"{_NAME}: argument 'out_features'", out_features, 1)
        factory = dict(device=device, dtype=dtype)
        self.weight = torch.nn.Parameter(torch.empty(num_gemms, out_features, in_features, **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(num_gemms, out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        self.init_fp8_state(device)

    def reset_parameters(self) -> None:
        """Each expert as torch.nn.Linear initializes itself: weight and bias uniform in +-1/sqrt(in_features)."""
        bound = 1.0 / math.sqrt(self.in_features)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    # ----------------------------------------------------------------------------- groups
    def group_sizes(self, rows: int, m_splits=None, offs: torch.Tensor | None = None) -> list[int]:
        """The groups' row counts from `m_splits` or `offs` (exactly one of them), checked against `rows`."""
        if (m_splits is None) == (offs is None):
            raise ValueError(f"{_NAME}: pass exactly one of the arguments 'm_splits' (row counts) and 'offs' "
                             "(cumulative row ends)")
        name = "m_splits" if offs is None else "offs"
        values = _int_list(m_splits if offs is None else offs, name)
        if len(values) != self.num_gemms:
            raise ValueError(f"{_NAME}: argument '{name}' must have num_gemms = {self.num_gemms} entries, "
                             f"got {len(values)}")
        if offs is not None:
            ends = values
            values = [end - start for start, end in zip([0, *ends[:-1]], ends)]
            if any(size < 0 for size in values) or ends[0] < 0:
                raise ValueError(f"{_NAME}: argument 'offs' must be non-decreasing from 0 (cumulative row ends), "
                                 f"got {ends}")
            if ends[-1] != rows:
                raise ValueError(f"{_NAME}: argument 'offs' must end at the input's row count {rows}, got {ends[-1]}")
            return values
        negative = [i for i, size in enumerate(values) if size < 0]
        if negative:
            raise ValueError(f"{_NAME}: argument 'm_splits' must hold row counts >= 0, got {values[negative[0]]} "
                             f"at index {negative[0]}")
        if sum(values) != rows:
            raise ValueError(f"{_NAME}: argument 'm_splits' must sum to the input's row count {rows}, "
                             f"got {sum(values)}")
        return values

    # ----------------------------------------------------------------------------- forward
    def forward(self, inp: torch.Tensor, m_splits: Sequence[int] | torch.Tensor | None = None, *,
                offs: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(inp, torch.Tensor) or inp.dim() == 0 or inp.shape[-1] != self.in_features:
            shape = tuple(inp.shape) if isinstance(inp, torch.Tensor) else type(inp).__name__
            raise ValueError(f"{_NAME}: argument 'inp' must have last dimension {self.in_features}, got {shape}")
        x2d = inp.reshape(-1, self.in_features)
        sizes = self.group_sizes(x2d.shape[0], m_splits, offs)
        if not autocast_state.is_fp8_enabled():
            out = self._per_group_linear(x2d, sizes, self.weight, self.bias)
        else:
            self.check_input(inp)

            def fp8_forward(x, ran_before):
                return self._fp8_forward(x, sizes, ran_before)

            out = self.run_fp8(x2d, fp8_forward, lambda x: self._fallback_forward(x, sizes))
        return out.reshape(*inp.shape[:-1], self.out_features)

    @staticmethod
    def _per_group_linear(x2d, sizes, weight, bias) -> torch.Tensor:
        parts = torch.split(x2d, sizes)
        return torch.cat([F.linear(part, weight[g], bias[g] if bias is not None else None)
                          for g, part in enumerate(parts)])

    def _fallback_forward(self, x2d: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        bias = self.bias.to(x2d.dtype) if self.bias is not None else None
        return self._per_group_linear(x2d, sizes, self.weight.to(x2d.dtype), bias)

    def _fp8_forward(self, x2d: torch.Tensor, sizes: list[int], ran_before: bool) -> torch.Tensor:
        # On the host, where the sizes are: the grouped GEMMs read host offsets with no device-to-host sync.
        offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)
        return meta_grouped_linear(self.fp8_meta, x2d, self.weight, self.bias, offs, sizes, False, ran_before)

    # ----------------------------------------------------------------------------- Fp8Module's hooks
    def check_input(self, input: torch.Tensor) -> None:
        # (fp8mp.functions.linear.check_input's checks, naming this forward's argument 'inp')
        if input.dtype not in HIGH_PRECISION_DTYPES:
            raise TypeError(f"{_NAME}: argument 'inp' must be float32, bfloat16 or float16, got {input.dtype}")
        if input.device != self.weight.device:
            raise RuntimeError(f"{_NAME}: argument 'inp' is on {input.device} but the weight is on {self.weight.device}")
        for name, size in (("in_features", self.in_features), ("out_features", self.out_features)):
            if size % _FP8_ALIGN:
                raise ValueError(f"{_NAME}: in FP8, {name} must be a multiple of {_FP8_ALIGN} (cuBLASLt's FP8 "
                                 f"alignment), got {size}")

    def high_precision_forward(self, input: torch.Tensor) -> torch.Tensor:
        raise TypeError(f"{_NAME} takes its groups with the input: call it as module(inp, m_splits)")

    fallback_forward = fp8_forward = high_precision_forward

    def to_torch(self) -> "GroupedLinear":
        """This module itself (what fp8mp.unconvert keeps): torch has no grouped linear module, and outside
        fp8_autocast this one computes as torch's per-expert F.linear loop."""
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Transformer Engine's checkpoints hold one parameter per GEMM ("weight0" ... and "bias0" ...): stack them.
        for name in ("weight", "bias"):
            keys = [f"{prefix}{name}{i}" for i in range(self.num_gemms)]
            if prefix + name not in state_dict and all(key in state_dict for key in keys):
                per_gemm = [state_dict[key] for key in keys]
                state_dict = {k: v for k, v in state_dict.items() if k not in keys}
                state_dict[prefix + name] = torch.stack(per_gemm)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


def _int_list(value, name: str) -> list[int]:
    """`value` (a sequence of ints or a 1-D integer tensor) as a list of Python ints, or a ValueError naming it."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"{_NAME}: argument '{name}' must be a 1-D integer tensor, got {value.dtype} of "
                             f"shape {tuple(value.shape)}")
        return [int(v) for v in value.tolist()]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{_NAME}: argument '{name}' must be a sequence of ints or a 1-D integer tensor, "
                         f"got {value!r}")
    return list(value)
