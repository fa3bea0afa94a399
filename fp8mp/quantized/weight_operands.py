"""The one weight interface: what a module's FP8 GEMMs get from its weight, whatever form the weight takes.

A weight takes one of four forms:

    a high-precision tensor (an nn.Parameter)      the call quantizes it (fp8mp/scaling/quantizer.py)
    stored in FP8 by fp8mp.fp8_model_init           StoredFp8Weight (stored_weight.py), over the module's buffers
    frozen in FP8                                  Fp8FrozenWeight (frozen_weight.py), a tensor subclass
    all-gathered in FP8 by FSDP2                   Fp8GatheredWeight (all_gather_weight.py), a tensor subclass

`weight_operands(weight, quantizer)` asks a weight in an FP8 form for its operands under the quantizer in use
(`weight.fp8_operands_for(quantizer)`), and answers for a plain tensor itself, so a module never branches on
the form: it hands the answer to its autograd function.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from fp8mp.ops.operand import Fp8Operand

__all__ = ["StoredOperands", "WeightOperands", "weight_operands", "readable_weight"]


class StoredOperands(NamedTuple):
    """The operands of a weight already in FP8: fprop's [N,K], and dgrad's [K,N] or None (fprop's transposed);
    weight_amax_recorded: the weight's amax reached the module's scaling state when it was cast (the shards'
    owners cast a weight FSDP2 gathers in FP8), so the forward's non-finite check folds it as a cast's."""

    fprop: Fp8Operand
    dgrad: Fp8Operand | None = None
    weight_amax_recorded: bool = False


class WeightOperands(NamedTuple):
    """leaf: the tensor autograd sends the weight gradient to (None: nothing receives it); stored: None (the call
    quantizes `leaf`), or the StoredOperands of a weight already in FP8."""

    leaf: torch.Tensor | None
    stored: StoredOperands | None


def weight_operands(weight, quantizer) -> WeightOperands:
    """The WeightOperands of `weight` (a tensor, or an FP8 weight form) under `quantizer`."""
    operands_for = getattr(type(weight), "fp8_operands_for", None)
    if operands_for is None:
        return WeightOperands(weight, None)
    return operands_for(weight, quantizer)


def readable_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` as a plain tensor to quantize from: a weight in an FP8 form decoded once (read as it is, it would
    decode on every op, once per expert's slice of a grouped weight); a plain tensor as it is."""
    decode = getattr(type(weight), "decode", None)
    return weight if decode is None else decode(weight)
