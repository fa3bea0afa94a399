"""Checkpoints across converted and unconverted models.

An fp8mp module's state_dict is its torch twin's plus its FP8 scaling state, as buffers under
"<module>.fp8_meta." (see fp8mp.scaling.Fp8Meta). So:

* an unconverted checkpoint loads into a converted model with `model.load_state_dict(sd, strict=True)`
  (the fp8mp modules start with fresh FP8 state);
* a converted checkpoint loads into an unconverted model with `fp8mp.load_state_dict(model, sd)`,
  which drops the FP8 state the model has no place for (one log line); torch's own
  `load_state_dict(strict=True)` would report those keys as unexpected.
"""
from __future__ import annotations

import logging
from typing import Mapping

import torch

from fp8mp.scaling.fp8_meta import Fp8Meta

__all__ = ["load_state_dict", "fp8_state_owner", "split_fp8_state"]

logger = logging.getLogger("fp8mp")

_META_NAME = "fp8_meta"
_STATE_NAMES = (*Fp8Meta.STATE_KEYS, "_extra_state")  # _extra_state: checkpoints of fp8mp 0.1.0


def fp8_state_owner(key: str) -> str | None:
    """The Fp8Meta path ("h.0.attn.c_attn.fp8_meta") a state_dict key belongs to, or None for other keys."""
    owner, _, name = key.rpartition(".")
    if name in _STATE_NAMES and owner.rpartition(".")[2] == _META_NAME:
        return owner
    return None


def split_fp8_state(state_dict: Mapping[str, object]) -> tuple[dict, dict]:
    """(weights, fp8_state): the keys of `state_dict` that are not FP8 scaling state, and those that are."""
    weights, fp8_state = {}, {}
    for key, value in state_dict.items():
        (fp8_state if fp8_state_owner(key) is not None else weights)[key] = value
    return weights, fp8_state


def load_state_dict(model: torch.nn.Module, state_dict: Mapping[str, object], strict: bool = True, assign: bool = False):
    """`model.load_state_dict(state_dict, strict, assign)`, taking checkpoints of converted and unconverted models.

    FP8 scaling state for modules that are not fp8mp modules in `model` is dropped, with one
    INFO line on the "fp8mp" logger; fp8mp modules the checkpoint has no FP8 state for start
    fresh (one INFO line). Everything else is checked as torch checks it. Returns torch's
    (missing_keys, unexpected_keys).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fp8mp.load_state_dict: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"fp8mp.load_state_dict: argument 'state_dict' must be a mapping, got {type(state_dict).__name__}")
    homes = {name for name, module in model.named_modules() if isinstance(module, Fp8Meta)}
    saved = {fp8_state_owner(key) for key in state_dict} - {None}
    orphans = saved - homes
    if orphans:
        logger.info("fp8mp.load_state_dict: ignoring the FP8 scaling state of %d modules that compute in high precision "
                    "in this model", len(orphans))
    fresh = homes - saved
    if fresh:
        logger.info("fp8mp.load_state_dict: %d fp8mp modules start with fresh FP8 scaling state (the checkpoint has "
                    "none for them)", len(fresh))
    kept = {key: value for key, value in state_dict.items() if fp8_state_owner(key) not in orphans}
    return model.load_state_dict(kept, strict=strict, assign=assign)


def state_dict_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and persistent buffers, each storage once.

    The FP8 scaling state of fp8mp modules (amax history, scales) is not weights and is not counted.
    """
    seen, total = set(), 0
    for key, tensor in module.state_dict(keep_vars=True).items():
        if not isinstance(tensor, torch.Tensor) or fp8_state_owner(key) is not None:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.device)
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total
