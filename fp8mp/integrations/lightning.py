"""Lightning: FP8 training with `Trainer(plugins=[FP8Precision()])` or `Fabric(plugins=[FP8Precision()])`.

    from fp8mp.integrations.lightning import FP8Precision        # added line 1
    trainer = L.Trainer(max_steps=1000, plugins=[FP8Precision()])  # added argument: FP8 from here on
    trainer.fit(module, loader)                                 # checkpoints and ckpt_path= resume carry the FP8 state

A precision plugin shaped like Lightning's `TransformerEnginePrecision`:
    - `convert_module`: `fp8mp.convert` (every nn.Linear whose dims are multiples of 16, `module_filter` aside),
      after casting the parameters to `weights_dtype`;
    - `forward_context` (training, validation, test, predict steps; Fabric's module forward):
      `torch.autocast(compute_dtype)` around `fp8mp.fp8_autocast(recipe, fp8_group=WORLD under torch.distributed)`;
    - `tensor_init_context` / `module_init_context`: parameters created in `weights_dtype`;
    - the optimizer step through fp8mp's `LossScaler` (the loss scaled before backward, gradients unscaled before
      Lightning's gradient clipping, the step skipped when a gradient or an FP8 cast met an Inf/NaN) and
      `fp8mp.fallback.FallbackPolicy` after it;
    - `state_dict` / `load_state_dict`: the loss scaler and the fallback policy, in Lightning's checkpoints (the
      FP8 scaling buffers are in the model's state_dict already).

`memory_lean=True` is docs/training.md's memory-lean way: bf16 parameters, no torch.autocast, activations saving
for backward in FP8 and norms in bf16 (use `fp8mp.optim.AdamW(state_dtype=torch.float8_e4m3fn)` in
`configure_optimizers`, and `recipe=fp8mp.recipe.RowwiseScaling()` for that recipe's loss).

Lightning is imported only when `FP8Precision` is first looked up (`pip install 'fp8mp[lightning]'` or
`'fp8mp[pytorch-lightning]'`). The class then derives from the Precision plugin of every Lightning package
already imported (`lightning.pytorch`, `pytorch_lightning`, or their Fabric alone), or of every installed one
when none is, so one object serves the Trainer and Fabric of either import path.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import weakref
from typing import Any, Callable

import torch

from fp8mp.nn.conversion import ModuleFilter, convert, fp8_dims_supported
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.nn.fp8_state_dict import split_fp8_state
from fp8mp.planning.plan import PrecisionPlan, as_plan
from fp8mp.scaling.autocast import fp8_autocast, validate_recipe
from fp8mp.scaling.recipe import Recipe
from fp8mp.training.fallback import FallbackPolicy
from fp8mp.training.loss_scaler import LossScaler
from fp8mp.training.trainer import nonfinite_layer_names

__all__ = ["FP8Precision"]

logger = logging.getLogger("fp8mp")

# (package, its Trainer's precision module, its Fabric's precision module), for each import path of Lightning.
_FLAVOURS = (
    ("lightning", "lightning.pytorch.plugins.precision", "lightning.fabric.plugins.precision"),
    ("pytorch_lightning", "pytorch_lightning.plugins.precision", "lightning_fabric.plugins.precision"),
    ("lightning_fabric", None, "lightning_fabric.plugins.precision"),
)
_WEIGHTS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _precision_bases() -> tuple[type, ...]:
    """Lightning's Precision classes to derive from: those of the packages already imported, else all installed."""
    imported = [f for f in _FLAVOURS if f[0] in sys.modules]
    chosen = imported or [f for f in _FLAVOURS if _installed(f[0])]
    bases: list[type] = []
    for _, trainer_module, fabric_module in chosen:
        module = trainer_module if trainer_module is not None and _installed(trainer_module.split(".")[0]) else fabric_module
        base = importlib.import_module(module).Precision
        if not any(issubclass(b, base) for b in bases):
            bases.append(base)
    if not bases:
        raise ImportError("fp8mp.integrations.lightning.FP8Precision needs Lightning: pip install 'fp8mp[lightning]' "
                          "(import lightning.pytorch) or 'fp8mp[pytorch-lightning]' (import pytorch_lightning)")
    return tuple(bases)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """torch's default dtype set to `dtype` inside the block, restored after it."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _cast_floats(data: Any, dtype: torch.dtype) -> Any:
    """`data` (tensors in dicts, lists, tuples, named tuples) with its floating-point tensors cast to `dtype`."""
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.to(dtype) if torch.is_floating_point(t) else t, data)


def _data_parallel_group():
    """torch.distributed's default group when a process group of 2+ ranks is initialized (DDP), else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


def _trainer_precision_of(cls: type, model: torch.nn.Module) -> type:
    """The Lightning Trainer Precision class among `cls`'s bases whose LightningModule `model` is."""
    bases = [b for b in cls.__mro__ if "connect" in vars(b) and b.__module__.split(".")[0] != "fp8mp"]
    for base in bases:
        package = sys.modules[base.__module__.split(".plugins.")[0]]
        if isinstance(model, package.LightningModule):
            return base
    return bases[0]


class _Fp8PrecisionCore:
    """What FP8Precision does, without Lightning (see the module docstring; Lightning's bases are added at lookup)."""

    def __init__(self, recipe: Recipe | None = None, weights_dtype: torch.dtype | None = None, memory_lean: bool = False,
                 frozen_weights: str | None = None, compute_dtype: torch.dtype | None = torch.bfloat16,
                 module_filter: ModuleFilter | None = None, loss_scaler: LossScaler | None = None,
                 fallback: FallbackPolicy | bool = True, plan: PrecisionPlan | str | os.PathLike | None = None):
        """
        Args:
            recipe: any fp8mp recipe, pinned on every converted module; None: DelayedScaling().
            weights_dtype: the parameters' dtype (float32, bfloat16 or float16); None: float32, or bfloat16 with
                memory_lean.
            memory_lean: bf16 parameters, no torch.autocast, `convert(fp8_saved_activations=True)`.
            frozen_weights: None, or "fp8": frozen (requires_grad=False) Linear weights stored in FP8 (`fp8mp.convert`).
            compute_dtype: torch.autocast's dtype around the FP8 layers (bfloat16, float16, or None for none);
                ignored with memory_lean and when it is the weights' dtype.
            module_filter: `fp8mp.convert`'s: `f(name, module) -> bool`, False keeps a module in high precision.
            loss_scaler: an fp8mp.LossScaler; None: LossScaler() (dynamic scaling, the step skipped on Inf/NaN).
            fallback: True: a FallbackPolicy() over the data-parallel group; a FallbackPolicy; False: none.
            plan: an fp8mp.PrecisionPlan or the path of its JSON: `convert_module` applies it (`fp8mp.convert`'s
                `plan`: each planned layer pinned to its recipe, "bf16" layers kept); refused beside module_filter.
                `recipe` then serves fp8_autocast, for FP8 modules the plan does not pin.
        """
        name = "FP8Precision"
        if recipe is not None:
            validate_recipe(recipe)
        if not isinstance(memory_lean, bool):
            raise TypeError(f"{name}: argument 'memory_lean' must be a bool, got {memory_lean!r}")
        if weights_dtype is None:
            weights_dtype = torch.bfloat16 if memory_lean else torch.float32
        if weights_dtype not in _WEIGHTS_DTYPES:
            raise ValueError(f"{name}: argument 'weights_dtype' must be one of {_WEIGHTS_DTYPES}, got {weights_dtype!r}")
        if memory_lean and weights_dtype != torch.bfloat16:
            raise ValueError(f"{name}: argument 'weights_dtype' must be torch.bfloat16 (or None) with memory_lean=True, "
                             f"got {weights_dtype}")
        if frozen_weights not in (None, "fp8"):
            raise ValueError(f"{name}: argument 'frozen_weights' must be None or \"fp8\", got {frozen_weights!r}")
        if compute_dtype not in (None, torch.bfloat16, torch.float16):
            raise ValueError(f"{name}: argument 'compute_dtype' must be torch.bfloat16, torch.float16 or None, "
                             f"got {compute_dtype!r}")
        if module_filter is not None and not callable(module_filter):
            raise TypeError(f"{name}: argument 'module_filter' must be callable as module_filter(name, module) -> bool")
        if plan is not None:
            plan = as_plan(plan, f"{name}: argument 'plan'")
            if module_filter is not None:
                raise ValueError(f"{name}: argument 'plan' decides which layers convert; pass it without "
                                 "'module_filter' (edit the plan's choices instead)")
        if loss_scaler is not None and not isinstance(loss_scaler, LossScaler):
            raise TypeError(f"{name}: argument 'loss_scaler' must be an fp8mp.LossScaler or None, "
                            f"got {type(loss_scaler).__name__}")
        if not isinstance(fallback, (bool, FallbackPolicy)):
            raise TypeError(f"{name}: argument 'fallback' must be a bool or an fp8mp.fallback.FallbackPolicy, "
                            f"got {type(fallback).__name__}")
        self.recipe = recipe
        self.weights_dtype = weights_dtype
        self.memory_lean = memory_lean
        self.frozen_weights = frozen_weights
        self.compute_dtype = None if memory_lean or compute_dtype == weights_dtype else compute_dtype
        self.module_filter = module_filter
        self.plan = plan
        self.scaler = loss_scaler if loss_scaler is not None else LossScaler()
        self._own_fallback = fallback is True
        self.fallback = FallbackPolicy() if fallback is True else (fallback or None)
        self.precision = ("bf16-mixed" if self.compute_dtype == torch.bfloat16 else
                          "16-mixed" if self.compute_dtype == torch.float16 else
                          {torch.float32: "32-true", torch.bfloat16: "bf16-true", torch.float16: "16-true"}[weights_dtype])
        self._module: Callable[[], torch.nn.Module | None] = lambda: None
        self._trainer_base: type | None = None  # the Trainer's Precision class while a Trainer drives the plugin

    # ------------------------------------------------------------------------------- model and forward
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the parameters to `weights_dtype`, then `fp8mp.convert` with the plugin's options."""
        if self.weights_dtype != torch.float32:
            module = module.to(dtype=self.weights_dtype)  # fp8mp's scaling buffers keep float32
        layers = dict(plan=self.plan) if self.plan is not None else dict(recipe=self.recipe, module_filter=self.module_filter)
        module = convert(module, frozen_weights=self.frozen_weights, fp8_saved_activations=self.memory_lean, **layers)
        sharded = self._sharded_linears(module)
        if sharded:
            raise ValueError(
                f"FP8Precision.convert_module: the Linear layers {sharded} were sharded by fully_shard before the plugin "
                "could convert them (ModelParallelStrategy calls configure_model first, and a sharded layer cannot be "
                "swapped): call fp8mp.convert(<the module>) in configure_model before fully_shard (the plugin's "
                "recipe= and module_filter= options go to that call)")
        self._module = weakref.ref(module)
        return module

    def _sharded_linears(self, module: torch.nn.Module) -> list[str]:
        """Names of the FP8-sized nn.Linear layers that fully_shard (FSDP2) wrapped before fp8mp converted them."""
        fsdp_module = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
        if fsdp_module is None:  # FSDP2 never loaded: nothing was sharded
            return []
        return [name for name, m in module.named_modules()
                if isinstance(m, fsdp_module) and isinstance(m, torch.nn.Linear) and not isinstance(m, Fp8Module)
                and fp8_dims_supported(m.in_features, m.out_features)
                and (self.module_filter is None or self.module_filter(name, m))]

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        return _default_dtype(self.weights_dtype) if self.weights_dtype != torch.float32 else contextlib.nullcontext()

    def module_init_context(self) -> contextlib.AbstractContextManager:
        return self.tensor_init_context()

    def _device_type(self) -> str:
        module = self._module()
        for tensor in (module.parameters() if module is not None else ()):
            return tensor.device.type
        return "cuda" if torch.cuda.is_available() else "cpu"

    def forward_context(self) -> contextlib.AbstractContextManager:
        """torch.autocast(compute_dtype) (unless None) around fp8_autocast(recipe, the data-parallel group)."""
        stack = contextlib.ExitStack()
        if self.compute_dtype is not None:
            stack.enter_context(torch.autocast(self._device_type(), dtype=self.compute_dtype))
        stack.enter_context(fp8_autocast(enabled=True, fp8_recipe=self.recipe, fp8_group=_data_parallel_group()))
        return stack

    def convert_input(self, data: Any) -> Any:
        return _cast_floats(data, self.weights_dtype) if self.weights_dtype != torch.float32 else data

    def convert_output(self, data: Any) -> Any:
        return _cast_floats(data, torch.get_default_dtype()) if self.weights_dtype != torch.float32 else data

    # ------------------------------------------------------------------------------- backward and step
    def connect(self, model, optimizers, lr_schedulers):
        """Called by the Trainer's strategy (never by Fabric): the Trainer's hooks apply from here on."""
        self._trainer_base = _trainer_precision_of(type(self), getattr(model, "module", model))
        return model, optimizers, lr_schedulers

    def teardown(self) -> None:
        self._trainer_base = None

    def pre_backward(self, tensor: torch.Tensor, module):
        if self._trainer_base is None:  # Fabric ignores what pre_backward returns: `backward` scales
            return None
        return self._trainer_base.pre_backward(self, self.scaler.scale(tensor), module)

    def backward(self, tensor: torch.Tensor, model, *args: Any, **kwargs: Any) -> None:
        if self._trainer_base is not None:  # the Trainer's (tensor, module, optimizer, ...), the loss already scaled
            return self._trainer_base.backward(self, tensor, model, *args, **kwargs)
        self.scaler.scale(tensor).backward(*args, **kwargs)

    def post_backward(self, tensor: torch.Tensor, module):
        if self._trainer_base is None:
            return None
        return self._trainer_base.post_backward(self, tensor, module)

    def unscale_gradients(self, optimizer) -> None:
        """Fabric's clip_gradients calls it first: the gradients are then the true ones."""
        self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer, model=None, closure=None, **kwargs: Any) -> Any:
        """Trainer: run the closure (forward, scaled backward), unscale, Lightning's clipping hooks, then the
        scaler's step (skipped on Inf/NaN). Fabric: the scaler's step. Then the scaler's update and the fallback."""
        if self._trainer_base is None:
            if closure is not None:
                raise TypeError("FP8Precision.optimizer_step: argument 'closure' is not supported (fp8mp's LossScaler "
                                "must see the gradients before the optimizer steps)")
            return self._step(optimizer, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise TypeError("FP8Precision: argument 'optimizer' cannot be LBFGS, whose step needs a closure")
        closure_result = closure()
        if closure_result is None and model.automatic_optimization:  # training_step returned None: no backward
            return closure_result
        self.scaler.unscale_(optimizer)
        self._trainer_base._after_closure(self, model, optimizer)  # on_before_optimizer_step, gradient clipping
        return self._step(optimizer, **kwargs)

    def _step(self, optimizer, **kwargs: Any) -> Any:
        output = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        module = self._module()
        if self.fallback is not None and module is not None:
            if self._own_fallback:
                self.fallback.fp8_group = _data_parallel_group()
            names = [name for name, _ in nonfinite_layer_names(module, self.scaler.nonfinite_fp8_casts)]
            if names:
                logger.warning("fp8mp FP8Precision: optimizer step skipped: FP8 casts met Inf/NaN in %s", names)
            self.fallback.step(module, nonfinite_layers=names if self.scaler.is_enabled() else None)
        return output

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=None) -> None:
        if self._trainer_base is None:
            raise RuntimeError("FP8Precision.clip_gradients is the Trainer's; with Fabric call fabric.clip_gradients")
        kwargs = {} if gradient_clip_algorithm is None else {"gradient_clip_algorithm": gradient_clip_algorithm}
        return self._trainer_base.clip_gradients(self, optimizer, clip_val, **kwargs)

    def _clip_gradients(self, model, optimizer, clip_val=None, gradient_clip_algorithm=None) -> None:
        return self._trainer_base._clip_gradients(self, model, optimizer, clip_val, gradient_clip_algorithm)

    # ------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The loss scaler's and the fallback policy's state (Lightning stores it under the key "FP8Precision")."""
        return {"loss_scaler": self.scaler.state_dict(),
                "fallback": self.fallback.state_dict() if self.fallback is not None else None}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Trainer checkpoints: the FP8 scaling buffers move from checkpoint["state_dict"] to the plugin's entry.

        The Trainer loads a checkpoint's state_dict into the model before this plugin converts it
        (`convert_module` runs in the strategy's setup); without its FP8 buffers the state_dict is that of the
        unconverted model, so the strict load holds (and `load_from_checkpoint` gives a plain model). The buffers
        load in `load_state_dict`, which the Trainer calls after the conversion.
        """
        weights, fp8_state = split_fp8_state(checkpoint["state_dict"])
        checkpoint["state_dict"] = weights
        checkpoint.setdefault(type(self).__qualname__, self.state_dict())["fp8_state"] = fp8_state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict()` (and, from a Trainer checkpoint, the FP8 scaling buffers into the converted model)."""
        if not isinstance(state_dict, dict) or "loss_scaler" not in state_dict:
            raise ValueError("FP8Precision.load_state_dict: argument 'state_dict' must be what FP8Precision.state_dict "
                             f"returned (a dict with key 'loss_scaler'), got {type(state_dict).__name__}")
        self.scaler.load_state_dict(state_dict["loss_scaler"])
        module = self._module()
        if state_dict.get("fp8_state"):
            if module is None:
                raise RuntimeError("FP8Precision.load_state_dict: the checkpoint's FP8 state needs the converted module: "
                                   "load it after the Trainer converted the model")
            unexpected = module.load_state_dict(state_dict["fp8_state"], strict=False).unexpected_keys
            if unexpected:
                raise ValueError(f"FP8Precision.load_state_dict: the checkpoint holds FP8 state for modules the model "
                                 f"does not convert: {unexpected}")
        if self.fallback is not None and state_dict.get("fallback") is not None:
            if module is None:
                raise RuntimeError("FP8Precision.load_state_dict: the fallback state needs the converted module: "
                                   "load it after the Trainer or fabric.setup converted the model")
            self.fallback.load_state_dict(state_dict["fallback"], module)


_CLASS: list[type] = []


def __getattr__(name: str):
    if name != "FP8Precision":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _CLASS:
        _CLASS.append(type("FP8Precision", (_Fp8PrecisionCore, *_precision_bases()),
                           {"__module__": __name__, "__doc__": _Fp8PrecisionCore.__doc__,
                            "__qualname__": "FP8Precision"}))
    return _CLASS[0]
