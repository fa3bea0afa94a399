"""Layer quantized, the forms an FP8 weight takes and the one interface they share (weight_operands.py): a weight
stored in FP8 by fp8mp.fp8_model_init (stored_weight.py), a frozen weight held as E4M3 codes
(frozen_weight.py: Fp8FrozenWeight) and a weight FSDP2 all-gathers in FP8 (all_gather_weight.py). Each answers
`fp8_operands_for(quantizer)` with the operands an FP8 GEMM takes as they are, so modules never branch on the
form. May import fp8mp.utils, fp8mp.ops, fp8mp.optim and fp8mp.scaling; never fp8mp.functions or above."""
from fp8mp.quantized.all_gather_weight import Fp8AllGatherWeight, Fp8GatheredWeight, precompute_fp8_weight_scales
from fp8mp.quantized.frozen_weight import Fp8FrozenWeight, decode_frozen_weights
from fp8mp.quantized.stored_weight import StoredFp8Weight, fp8_model_init
from fp8mp.quantized.weight_operands import WeightOperands, readable_weight, weight_operands

__all__ = ["Fp8AllGatherWeight", "Fp8GatheredWeight", "precompute_fp8_weight_scales", "Fp8FrozenWeight",
           "decode_frozen_weights", "StoredFp8Weight", "fp8_model_init", "WeightOperands", "readable_weight",
           "weight_operands"]
