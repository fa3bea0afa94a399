"""Layer nn, modules: drop-in torch.nn modules, the autograd functions only they use, FP8 weight storage, LoRA
and convert/unconvert; re-exports the memory levers (fp8mp.memory) under their names here. May import every
layer below it (fp8mp.utils up to fp8mp.parallel), never fp8mp.training or fp8mp.integrations."""
from fp8mp.memory.chunked_cross_entropy import chunked_linear_cross_entropy
from fp8mp.memory.embedding_grad_rows import embedding_grad_in_row_blocks, restore_embedding_grad
from fp8mp.memory.fp8_recompute import fp8_recompute
from fp8mp.nn import fp8_state_dict, lora
from fp8mp.nn.bf16_via_fp32 import bf16_matmul_via_fp32, cpu_has_bf16_matmul_units
from fp8mp.nn.conv1d import Conv1D
from fp8mp.nn.fp8_state_dict import load_state_dict
from fp8mp.nn.conversion import (FP8_MODULES, convert, convertible_layers, enable_fp8_all_gather,
                                 store_frozen_weights_in_fp8, unconvert)
from fp8mp.nn.conversion_report import converted_layers
from fp8mp.quantized.all_gather_weight import Fp8AllGatherWeight, Fp8GatheredWeight, precompute_fp8_weight_scales
from fp8mp.quantized.frozen_weight import Fp8FrozenWeight, decode_frozen_weights, tensor_bytes
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.quantized.stored_weight import fp8_model_init
from fp8mp.nn.grouped_linear import GroupedLinear
from fp8mp.nn.layernorm_linear import LayerNormLinear
from fp8mp.nn.linear import Linear
from fp8mp.nn.lora import LoRALinear
from fp8mp.nn.normalization import LayerNorm, RMSNorm

__all__ = ["Fp8Module", "Linear", "Conv1D", "GroupedLinear", "LayerNorm", "RMSNorm", "LayerNormLinear", "LoRALinear", "FP8_MODULES", "convert", "unconvert", "convertible_layers", "converted_layers",
           "fp8_model_init", "Fp8FrozenWeight", "store_frozen_weights_in_fp8", "decode_frozen_weights", "tensor_bytes", "lora", "fp8_state_dict", "load_state_dict",
           "chunked_linear_cross_entropy", "embedding_grad_in_row_blocks", "restore_embedding_grad", "fp8_recompute", "Fp8AllGatherWeight", "Fp8GatheredWeight", "enable_fp8_all_gather",
           "precompute_fp8_weight_scales", "bf16_matmul_via_fp32", "cpu_has_bf16_matmul_units"]
