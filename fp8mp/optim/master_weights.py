"""`MasterWeightOptimizer`: FP32 master weights for FP8-weight layers, re-quantized after each step.

Deprecated (FutureWarning): the FP32 masters and their gradients take 8 bytes a parameter, so training
weights stored in FP8 this way saves nothing against FP32 weights. Train bf16 `nn.Parameter`s with
`fp8mp.optim.AdamW(params, state_dtype=torch.float8_e4m3fn)` instead, and store weights that are not
trained in FP8 with `fp8mp.convert(model, frozen_weights="fp8")` (fp8mp/quantized/frozen_weight.py).

    with fp8mp.fp8_model_init():
        model = build_model()
    optimizer = fp8mp.optim.MasterWeightOptimizer(lambda params: torch.optim.AdamW(params, lr=1e-3), model)
    ...
    loss.backward()              # dW of each FP8-weight layer lands on its FP32 master
    optimizer.step()             # the update is applied in FP32, then each FP8 weight = cast(master)

The masters start as the decoded FP8 weights. See fp8mp/quantized/stored_weight.py for why the master is
the autograd leaf. Create this wrapper after moving the model to its device (the masters are
made on the FP8 weights' device). For LR schedulers, which want a `torch.optim.Optimizer`,
pass `wrapper.optimizer`.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch

__all__ = ["MasterWeightOptimizer", "DEPRECATION_MESSAGE"]

DEPRECATION_MESSAGE = (
    "fp8mp.optim.MasterWeightOptimizer is deprecated: FP32 masters of FP8-stored weights and their gradients "
    "take 8 bytes a parameter, so this saves no memory. Train bf16 nn.Parameters with "
    "fp8mp.optim.AdamW(params, state_dtype=torch.float8_e4m3fn), and store weights that are not trained in FP8 "
    "with fp8mp.convert(model, frozen_weights='fp8')")

OptimizerFactory = Callable[[list], torch.optim.Optimizer]


class MasterWeightOptimizer:
    """Wraps an optimizer so that it trains the FP8-weight `fp8mp.nn.Linear` layers of `model`.

    Deprecated: see the module docstring for what to use instead.

    Args:
        optimizer: a factory `params -> torch.optim.Optimizer`, called with all of `model`'s
            parameters plus the FP32 masters (the usual choice); or an optimizer already built over
            `model.parameters()`, to which the masters are added as one new param group (with its
            defaults).
        model: a module containing at least one FP8-weight `fp8mp.nn.Linear` (layers frozen with
            `freeze_weight()` get no master and are not trained).

    Has the optimizer interface `LossScaler` and training loops use: `step`, `zero_grad`,
    `param_groups`, `state`, `state_dict`, `load_state_dict`. The masters are in `state_dict()`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer | OptimizerFactory, model: torch.nn.Module):
        warnings.warn(DEPRECATION_MESSAGE, FutureWarning, stacklevel=2)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"MasterWeightOptimizer: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
        self.layers = [m for m in model.modules()
                       if getattr(m, "stores_fp8_weight", False) and not getattr(m, "weight_frozen", False)]
        if not self.layers:
            raise ValueError("MasterWeightOptimizer: argument 'model' has no unfrozen fp8mp.nn.Linear storing its weight in FP8 "
                             "(create them with fp8_weight=True or inside fp8mp.fp8_model_init())")
        self.masters = [self._new_master(layer) for layer in self.layers]
        self.optimizer = self._build(optimizer, model)
        for layer, master in zip(self.layers, self.masters):
            layer.attach_master_weight(master)

    @staticmethod
    def _new_master(layer) -> torch.nn.Parameter:
        return torch.nn.Parameter(layer.decode_stored_weight(torch.float32))

    def _build(self, optimizer, model: torch.nn.Module) -> torch.optim.Optimizer:
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizer.add_param_group({"params": self.masters})
            return optimizer
        if not callable(optimizer):
            raise TypeError("MasterWeightOptimizer: argument 'optimizer' must be a torch.optim.Optimizer or a "
                            f"callable params -> Optimizer, got {type(optimizer).__name__}")
        built = optimizer(list(model.parameters()) + self.masters)
        if not isinstance(built, torch.optim.Optimizer):
            raise TypeError("MasterWeightOptimizer: argument 'optimizer' must return a torch.optim.Optimizer, "
                            f"got {type(built).__name__}")
        return built

    # ----------------------------------------------------------------------------- optimizer interface
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """The wrapped optimizer's step (in FP32 on the masters), then re-quantize every FP8 weight."""
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        self.requantize()
        return loss

    def requantize(self) -> None:
        """FP8 weight of each layer = its quantization of the master (per-tensor or its recipe's block scales)."""
        for layer, master in zip(self.layers, self.masters):
            layer.quantize_weight_from(master)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "master_weights": [m.detach() for m in self.masters]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the wrapped optimizer and the masters, and re-quantize the FP8 weights from them."""
        masters = state_dict.get("master_weights") if isinstance(state_dict, dict) else None
        if masters is None or "optimizer" not in state_dict:
            raise ValueError("MasterWeightOptimizer.load_state_dict: argument 'state_dict' must have keys "
                             "'optimizer' and 'master_weights'")
        shapes = [tuple(m.shape) for m in self.masters]
        if [tuple(m.shape) for m in masters] != shapes:
            raise ValueError(f"MasterWeightOptimizer.load_state_dict: argument 'state_dict' has master weights of "
                             f"shapes {[tuple(m.shape) for m in masters]}, this model's are {shapes}")
        with torch.no_grad():
            for master, saved in zip(self.masters, masters):
                master.copy_(saved)
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.requantize()

    def __repr__(self) -> str:
        return f"MasterWeightOptimizer({len(self.masters)} FP32 masters, {self.optimizer!r})"
