"""A Hugging Face causal LM whose loss never holds the [tokens, vocab] logits, in one line::

    import fp8mp.integrations.hf as fp8_hf
    fp8_hf.use_chunked_loss(model)          # model(input_ids=..., labels=...).loss as before

With `labels`, the model's forward then runs its decoder (``model.model``), and the LM head and the loss
together as fp8mp.nn.chunked_linear_cross_entropy, with the label shift, ignore_index=-100, the mean over
the tokens not ignored and `num_items_in_batch` (a sum divided by it) of transformers' ForCausalLMLoss; the
output's `logits` is then None. Without `labels` (evaluation of logits, `generate`) the forward is the
model's own. `restore_loss(model)` undoes it. The head stays in high precision; an FP8 head (an fp8mp module)
or one with a bias, and a model that caps its logits (Gemma's final_logit_softcapping), are refused.

Under fp8mp.step_in_backward an untied head's gradient comes a block of vocabulary rows at a time (stepped
at once: fp8mp/memory/chunked_cross_entropy.py); a head tied to the input embedding keeps its whole gradient,
where the embedding's part joins it.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from fp8mp.memory.chunked_cross_entropy import chunked_linear_cross_entropy

__all__ = ["use_chunked_loss", "restore_loss", "uses_chunked_loss"]

_ATTRIBUTE = "_fp8mp_chunked_loss"
IGNORE_INDEX = -100


def uses_chunked_loss(model: torch.nn.Module) -> bool:
    return getattr(model, _ATTRIBUTE, None) is not None


def _check(model: torch.nn.Module) -> torch.nn.Module:
    name = "fp8mp.integrations.hf.use_chunked_loss"
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is None or not isinstance(getattr(model, "model", None), torch.nn.Module):
        raise TypeError(f"{name}: argument 'model' must be a transformers causal LM with a decoder `model.model` and "
                        f"an output embedding, got {type(model).__name__}")
    if type(head) is not torch.nn.Linear:
        raise TypeError(f"{name}: the output embedding of argument 'model' is a {type(head).__name__}; the chunked "
                        "loss takes a plain torch.nn.Linear head (keep the LM head in high precision)")
    if head.bias is not None:
        raise ValueError(f"{name}: the output embedding of argument 'model' has a bias; the chunked loss takes none")
    if getattr(getattr(model, "config", None), "final_logit_softcapping", None) is not None:
        raise ValueError(f"{name}: argument 'model' caps its logits (config.final_logit_softcapping); not supported")
    return head


def use_chunked_loss(model: torch.nn.Module, chunk_tokens: int | None = None) -> torch.nn.Module:
    """Make `model`'s forward with `labels` compute the loss chunk by chunk (module docstring); returns `model`.

    chunk_tokens: tokens per chunk (default: fp8mp.memory.chunked_cross_entropy.default_chunk_tokens(vocab)).
    """
    _check(model)
    if uses_chunked_loss(model):
        raise RuntimeError("fp8mp.integrations.hf.use_chunked_loss: argument 'model' already uses the chunked loss")
    setattr(model, _ATTRIBUTE, chunk_tokens if chunk_tokens is not None else 0)
    model.forward = types.MethodType(_forward, model)  # an instance attribute: the class is untouched
    return model


def restore_loss(model: torch.nn.Module) -> torch.nn.Module:
    """Undo use_chunked_loss: the model's own forward again."""
    if not uses_chunked_loss(model):
        raise RuntimeError("fp8mp.integrations.hf.restore_loss: argument 'model' does not use the chunked loss")
    del model.forward
    delattr(model, _ATTRIBUTE)
    return model


def _forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
             labels=None, use_cache=None, **kwargs):
    if labels is None:
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                                  **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    head = _check(self)
    kwargs.pop("logits_to_keep", None)  # the loss covers every position, as with logits_to_keep=0
    num_items_in_batch = kwargs.pop("num_items_in_batch", None)
    shift_labels = kwargs.pop("shift_labels", None)
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    hidden = outputs.last_hidden_state
    if shift_labels is None:  # tokens < n predict n, as transformers' ForCausalLMLoss
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    chunk_tokens = getattr(self, _ATTRIBUTE) or None
    reduction = "sum" if num_items_in_batch is not None else "mean"
    embedding = self.get_input_embeddings()
    tied = getattr(embedding, "weight", None) is head.weight  # the head's gradient then has two parts
    loss = chunked_linear_cross_entropy(hidden, head.weight, shift_labels.to(hidden.device), ignore_index=IGNORE_INDEX,
                                        reduction=reduction, chunk_tokens=chunk_tokens, row_blocks=not tied)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)
