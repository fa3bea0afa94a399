"""Drop-in torch.nn modules backed by fp8mp's kernels."""
from fp8mp.nn.linear import Linear
from fp8mp.nn.norm import LayerNorm, RMSNorm
from fp8mp.nn.layernorm_linear import LayerNormLinear

# Modules fp8mp.unconvert turns back into their torch twins (each has `to_torch()`).
FP8_MODULES = (Linear, LayerNorm, RMSNorm)

__all__ = ["Linear", "LayerNorm", "RMSNorm", "LayerNormLinear", "FP8_MODULES"]
from fp8mp.nn.lora import LoRALinear  # noqa: E402
from fp8mp.nn import lora  # noqa: E402,F401

__all__ += ["LoRALinear"]
