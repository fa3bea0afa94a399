"""FP8 storage for everything a Hugging Face Llama / Mistral / Qwen2 / Qwen3 decoder saves for backward outside
its Linear layers, in one line::

    import fp8mp.integrations.hf as fp8_hf
    fp8_hf.use_fp8_saved_activations(model)

Three pieces, each storing what it saves as E4M3 with one fp32 scale per 1 x 128 group (the norms: bf16):

* the norm and activation-function modules (`fp8mp.memory.saved_activations.enable_fp8_saved_activations`, what
  ``fp8mp.convert(model, fp8_saved_activations=True)`` does: norms keep bf16, which that module says why);
* the gated MLP multiply ``act_fn(gate_proj(x)) * up_proj(x)``: each MLP of the classes in `GATED_MLP_CLASSES`
  gets an instance forward that runs the multiply through `fp8mp.nn.fp8_recompute` (gate and up saved in FP8,
  ``act_fn(gate)`` computed again in backward) instead of keeping ``act_fn(gate)`` and ``up`` in bf16;
* attention: the model's attention implementation "sdpa" becomes "fp8mp_sdpa" (registered with transformers'
  ``AttentionInterface`` and ``AttentionMaskInterface``: transformers' own SDPA function and mask, run through
  fp8_recompute), so query, key and value are saved in FP8 and the attention output and log-sum-exps are not
  saved (backward runs the attention forward once more).

The forward's results are those of the model's own forward bit for bit; backward gets the exact gradients at
inputs each within half an E4M3 spacing (fp8mp/memory/fp8_recompute.py). Refused: attention dropout while training
(the recomputation would draw other numbers), an attention implementation other than SDPA, and attention weights
(`output_attentions`). `restore_saved_activations(model)` undoes all three.
"""
from __future__ import annotations

import types

import torch

from fp8mp.memory.fp8_recompute import fp8_recompute
from fp8mp.memory.saved_activations import disable_fp8_saved_activations, enable_fp8_saved_activations

__all__ = ["use_fp8_saved_activations", "restore_saved_activations", "uses_fp8_saved_activations",
           "GATED_MLP_CLASSES", "ATTENTION_IMPLEMENTATION"]

# Classes whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (transformers 5).
GATED_MLP_CLASSES = frozenset({"transformers.models.llama.modeling_llama.LlamaMLP",
                               "transformers.models.mistral.modeling_mistral.MistralMLP",
                               "transformers.models.qwen2.modeling_qwen2.Qwen2MLP",
                               "transformers.models.qwen3.modeling_qwen3.Qwen3MLP"})
ATTENTION_IMPLEMENTATION = "fp8mp_sdpa"
BASE_IMPLEMENTATION = "sdpa"
_ATTRIBUTE = "_fp8mp_saved_activations"
_NAME = "fp8mp.integrations.hf.use_fp8_saved_activations"


def _class_name(module: torch.nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def is_gated_mlp(module: torch.nn.Module) -> bool:
    return _class_name(module) in GATED_MLP_CLASSES


def _gated_mlp_forward(self, x):
    act_fn = self.act_fn
    return self.down_proj(fp8_recompute(lambda gate, up: act_fn(gate) * up, self.gate_proj(x), self.up_proj(x)))


def fp8_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, **kwargs):
    """transformers' SDPA attention (its AttentionInterface signature) with q, k, v saved for backward in FP8."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if dropout:
        raise ValueError(f"{_NAME}: attention dropout ({dropout}) while training; the attention computed again in "
                         "backward would draw other numbers: set config.attention_dropout = 0")
    if kwargs.get("output_attentions"):
        raise ValueError(f"{_NAME}: output_attentions=True; SDPA returns no attention weights")

    def attend(q, k, v, mask):
        return sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, **kwargs)[0]

    return fp8_recompute(attend, query, key, value, attention_mask), None


def register_attention() -> None:
    """Register "fp8mp_sdpa" with transformers' attention and mask interfaces (SDPA's mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, fp8_sdpa_attention)  # registering again: the same entry
    AttentionMaskInterface.register(ATTENTION_IMPLEMENTATION, sdpa_mask)


def uses_fp8_saved_activations(model: torch.nn.Module) -> bool:
    return getattr(model, _ATTRIBUTE, None) is not None


def use_fp8_saved_activations(model: torch.nn.Module) -> torch.nn.Module:
    """Store what `model` saves for backward in FP8: activations, gated MLP multiplies, attention, norms in bf16 (module
    docstring); returns `model`. The model's attention implementation must be "sdpa"."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{_NAME}: argument 'model' must be a transformers model, got {type(model).__name__}")
    if uses_fp8_saved_activations(model):
        raise RuntimeError(f"{_NAME}: argument 'model' already stores its saved activations in FP8")
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation != BASE_IMPLEMENTATION or not callable(getattr(model, "set_attn_implementation", None)):
        raise ValueError(f"{_NAME}: argument 'model' must be a transformers model with the 'sdpa' attention "
                         f"implementation, got {type(model).__name__} with {implementation!r}")
    register_attention()
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    enable_fp8_saved_activations(model)
    for module in model.modules():
        if is_gated_mlp(module):
            module.forward = types.MethodType(_gated_mlp_forward, module)  # an instance attribute: the class is untouched
    setattr(model, _ATTRIBUTE, implementation)
    return model


def restore_saved_activations(model: torch.nn.Module) -> torch.nn.Module:
    """Undo use_fp8_saved_activations: the model's own MLP forwards, its attention implementation, no FP8 hooks."""
    if not uses_fp8_saved_activations(model):
        raise RuntimeError("fp8mp.integrations.hf.restore_saved_activations: argument 'model' does not store its saved "
                           "activations in FP8 (use_fp8_saved_activations)")
    for module in model.modules():
        if is_gated_mlp(module) and "forward" in vars(module):
            del module.forward
    disable_fp8_saved_activations(model)
    model.set_attn_implementation(getattr(model, _ATTRIBUTE))
    delattr(model, _ATTRIBUTE)
    return model
