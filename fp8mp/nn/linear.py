"""`fp8mp.nn.Linear`: a drop-in `torch.nn.Linear` that computes in FP8 inside `fp8_autocast`."""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from fp8mp.scaling import autocast as autocast_state
from fp8mp.nn import fp8_weight as fp8_weight_storage
from fp8mp.nn.block_linear_function import stored_weight_operands
from fp8mp.nn.fp8_linear_function import check_input, fp8_linear
from fp8mp.nn.fp8_all_gather import Fp8GatheredWeight
from fp8mp.nn.fp8_frozen_weight import Fp8FrozenWeight
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.nn.sharded_linear import gathered_input, sharded_linear
from fp8mp.optim.sharding import is_dtensor

# The buffers an FP8-stored weight may have, in the order stored_weight_operands takes the block ones.
FP8_WEIGHT_BUFFERS = ("weight_fp8", "weight_scale_inv", "weight_fp8_t", "weight_scale_inv_t", "weight_scale")


class Linear(Fp8Module, torch.nn.Linear):
    """y = x @ W.T + b, in FP8 inside `fp8mp.fp8_autocast`, in the parameters' precision outside it.

    Same constructor, parameters and state_dict keys as `torch.nn.Linear`, so its checkpoints load
    as they are. In FP8, input and weight are cast to the recipe's forward format (E4M3), the
    gradient of the output to its backward format (E5M2 for Format.HYBRID), and all three GEMMs
    (fprop, dgrad, wgrad) run in FP8 with fp32 accumulation. The output has the input's dtype, or
    under `torch.autocast` autocast's dtype, as nn.Linear's output does (fp8mp/nn/output_dtype.py);
    the input gradient has the input's dtype, the weight gradient the weight's.

    A frozen `weight` stored by `fp8mp.convert(model, frozen_weights="fp8")` is an Fp8FrozenWeight
    (fp8mp/nn/fp8_frozen_weight.py): its E4M3 codes and scale go to the FP8 GEMM as they are.

    fp8_weight=True (default: True inside `fp8mp.fp8_model_init()`) stores the weight in FP8
    (buffers weight_fp8, weight_scale, weight_scale_inv; `weight` is None), for inference or frozen
    (`freeze_weight()`), or trained through FP32 masters held by the deprecated
    `fp8mp.optim.MasterWeightOptimizer`; see fp8mp/nn/fp8_weight.py. Under
    `fp8_model_init(recipe=R)` with a fine-grained R the buffers are R's (weight_fp8 and its block
    scales weight_scale_inv, plus weight_fp8_t / weight_scale_inv_t where R's blocks are not square).
    Outside fp8_autocast such a layer computes in the input's dtype with the decoded weight.

    `fp8_fallback` (set by `fp8mp.fallback.FallbackPolicy`): when True, the layer computes in the
    input's dtype (plain F.linear) even inside fp8_autocast.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 fp8_weight: bool | None = None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.init_fp8_state(device)
        self.weight_frozen = False  # set by freeze_weight()
        self._master_weight_ref = None
        if fp8_weight_storage.is_fp8_model_init() if fp8_weight is None else fp8_weight:
            self.store_weight_in_fp8()

    # ----------------------------------------------------------------------------- Fp8Module's hooks
    def check_input(self, input: torch.Tensor) -> None:
        weight = self.weight
        check_input("fp8mp.nn.Linear", input, self.in_features, weight if weight is not None else self.weight_fp8)

    def high_precision_forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return self.fallback_forward(input)
        return F.linear(gathered_input(input, self.weight), self.weight, self.bias)

    def fallback_forward(self, input: torch.Tensor) -> torch.Tensor:
        """F.linear in the input's dtype: the fallback path, and FP8-weight layers outside fp8_autocast."""
        if self.weight is None:
            weight = self.decode_stored_weight(input.dtype, self._weight_grad_leaf())
        else:
            weight = self.weight.to(input.dtype)
            input = gathered_input(input, weight)
        return F.linear(input, weight, self.bias.to(input.dtype) if self.bias is not None else None)

    def fp8_forward(self, input: torch.Tensor, ran_before: bool) -> torch.Tensor:
        meta = self.fp8_meta
        weight, stored = self.fp8_weight_operands(meta.recipe)
        group = autocast_state.get_fp8_group()
        if is_dtensor(weight) or is_dtensor(input):  # tensor parallel: run on the local shards
            if stored is not None:
                raise NotImplementedError("fp8mp.nn.Linear: an FP8-stored or frozen FP8 weight under tensor parallel "
                                          "is not supported; keep the weight a high-precision parameter")
            return sharded_linear("fp8mp.nn.Linear", input, weight, self.bias, meta, group, ran_before)
        return fp8_linear(input, weight, self.bias, meta, fp8_weight=stored, group=group, ran_before=ran_before)

    def fp8_weight_operands(self, recipe) -> tuple[torch.Tensor | None, object]:
        """(weight, stored) as the FP8 linear functions take them under `recipe`: the `weight` parameter and
        None; for a weight FSDP2 all-gathered in FP8 (fp8mp/nn/fp8_all_gather.py) the parameter and its
        (codes, scale_inv); for a frozen Fp8FrozenWeight under a per-tensor E4M3 recipe, None and its (codes, scale_inv);
        or, for an FP8-stored weight, the leaf that receives its gradient (the master, or None) and
        the stored operands (refusing a recipe of another weight layout)."""
        weight = self.weight
        if isinstance(weight, Fp8GatheredWeight):  # FSDP2 gathered it in FP8: the leaf, and its codes as they are
            return weight, weight.fp8_operands()
        if isinstance(weight, Fp8FrozenWeight) and fp8_weight_storage.block_weight_layout(recipe) is None \
                and recipe.fp8_format.forward_format == "e4m3":
            # the codes are what a current-scaling cast of the decoded weight gives: use them as they are
            return None, weight.fp8_operands()
        if weight is not None:
            return weight, None
        stored = self._stored_weight_for(recipe)
        return self._weight_grad_leaf(), stored

    # ----------------------------------------------------------------------------- FP8 weight storage
    def store_weight_in_fp8(self, recipe=None) -> None:
        """Replace the `weight` parameter by FP8 buffers quantized for `recipe`.

        recipe: default this layer's fp8_recipe, else fp8_model_init's; per-tensor recipes (and None)
        give one current-scaling scale from the weight's amax, fine-grained ones their block scales.
        """
        recipe = recipe or self.fp8_recipe or fp8_weight_storage.model_init_recipe()
        weight = self.weight.detach()
        self.register_parameter("weight", None)
        self.fp8_weight_layout = fp8_weight_storage.block_weight_layout(recipe)
        self._fp8_weight_recipe = recipe if self.fp8_weight_layout is not None else None
        if self.fp8_weight_layout is not None:
            for name, value in fp8_weight_storage.block_weight_buffers(weight, recipe).items():
                self.register_buffer(name, value)
        else:
            factory = dict(dtype=torch.float32, device=weight.device)
            self.register_buffer("weight_fp8", torch.empty_like(weight, dtype=fp8_weight_storage.WEIGHT_DTYPE))
            self.register_buffer("weight_scale", torch.ones(1, **factory))
            self.register_buffer("weight_scale_inv", torch.ones(1, **factory))
            self.quantize_weight_from(weight)
        self._fp8_weight_buffers = tuple(name for name in FP8_WEIGHT_BUFFERS if name in self._buffers)

    def _apply(self, fn, recurse=True):
        # model.bfloat16() / .to(dtype) convert every floating-point buffer, float8 included: keep the
        # stored FP8 weight and its scales as they were, moved to the new device (bit for bit).
        stored = {name: self._buffers[name] for name in self._fp8_weight_buffers} if self.stores_fp8_weight else {}
        super()._apply(fn, recurse)
        for name, before in stored.items():
            after = self._buffers[name]
            if after.dtype != before.dtype:
                self._buffers[name] = before.to(after.device)
        return self

    @property
    def stores_fp8_weight(self) -> bool:
        return self.weight is None

    def quantize_weight_from(self, source: torch.Tensor) -> None:
        """Set the stored FP8 weight (and its scales) to the quantization of `source` (in place).

        Per-tensor storage: cast_to_fp8(source) with a scale from source's amax; block storage: the
        quantization its recipe's forward would give `source`.
        """
        self._require_fp8_weight("quantize_weight_from")
        if source.shape != self.weight_fp8.shape:
            raise ValueError(f"fp8mp.nn.Linear.quantize_weight_from: argument 'source' must have shape "
                             f"{tuple(self.weight_fp8.shape)}, got {tuple(source.shape)}")
        if self.fp8_weight_layout is not None:
            buffers = {name: self._buffers[name] for name in self._fp8_weight_buffers}
            fp8_weight_storage.block_quantize_weight_(source, self._fp8_weight_recipe, buffers)
        else:
            fp8_weight_storage.quantize_weight_(source, self.weight_fp8, self.weight_scale, self.weight_scale_inv)

    def decode_stored_weight(self, dtype: torch.dtype, master: torch.Tensor | None = None) -> torch.Tensor:
        """The stored FP8 weight decoded to `dtype` [N, K]; differentiable into `master` when one is given."""
        self._require_fp8_weight("decode_stored_weight")
        layout = self.fp8_weight_layout
        blocks = None if layout is None else (layout.block_rows, layout.block_k or self.in_features)
        return fp8_weight_storage.decode_weight(self.weight_fp8, self.weight_scale_inv, dtype, master, blocks)

    def _stored_weight_for(self, recipe):
        """The stored weight as fp8_linear takes it under `recipe`; refuses a recipe of another weight layout."""
        needed = fp8_weight_storage.block_weight_layout(recipe)
        if needed != self.fp8_weight_layout:
            stored = self.fp8_weight_layout or "per-tensor scaling (DelayedScaling / CurrentScaling)"
            raise RuntimeError(
                f"fp8mp.nn.Linear: this layer's FP8 weight is stored for {stored}, but it runs under "
                f"{type(recipe).__name__}, which needs {needed or 'one per-tensor scale'}: create the model inside "
                "fp8mp.fp8_model_init(recipe=...) with the recipe it runs under")
        if needed is None:
            return self.weight_fp8, self.weight_scale_inv
        return stored_weight_operands(recipe, *(self._buffers[name] for name in self._fp8_weight_buffers))

    def attach_master_weight(self, master: torch.nn.Parameter) -> None:
        """Make `master` (an FP32 Parameter of the weight's shape) the leaf that receives dW.

        Held by weak reference: the optimizer that owns the master owns its memory.
        """
        self._require_fp8_weight("attach_master_weight")
        if not isinstance(master, torch.nn.Parameter) or master.shape != self.weight_fp8.shape:
            raise ValueError(f"fp8mp.nn.Linear.attach_master_weight: argument 'master' must be an nn.Parameter of shape "
                             f"{tuple(self.weight_fp8.shape)}, got {type(master).__name__} {tuple(getattr(master, 'shape', ()))}")
        self._master_weight_ref = weakref.ref(master)

    def freeze_weight(self) -> None:
        """Never train this layer's weight: `requires_grad` off, and an FP8-stored weight then needs no master.

        A frozen FP8-stored layer runs in training mode with grad enabled (gradients still flow to its
        input), e.g. as the base of a LoRA adapter (fp8mp.nn.LoRALinear). The bias is left as it is.
        """
        self.weight_frozen = True
        if self.weight is not None:
            self.weight.requires_grad_(False)

    def _weight_grad_leaf(self) -> torch.nn.Parameter | None:
        master = self._master_weight_ref() if self._master_weight_ref is not None else None
        if master is None and self.training and torch.is_grad_enabled() and not self.weight_frozen:
            raise RuntimeError(
                "fp8mp.nn.Linear with an FP8 weight has no master weight to receive its gradient: create "
                "fp8mp.optim.MasterWeightOptimizer(optimizer, model) before training, or run inference under "
                ".eval() or torch.no_grad()"
            )
        return master

    def _require_fp8_weight(self, what: str) -> None:
        if self.weight is not None:
            raise RuntimeError(f"fp8mp.nn.Linear.{what}: this layer stores its weight in high precision "
                               "(create it with fp8_weight=True or inside fp8mp.fp8_model_init())")

    def to_torch(self) -> torch.nn.Linear:
        """A torch.nn.Linear sharing this module's parameters (the FP8 scaling state is dropped).

        An FP8-stored weight is decoded into a new fp32 parameter.
        """
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        weight = self.weight
        if weight is None:
            weight = torch.nn.Parameter(self.decode_stored_weight(torch.float32).detach())
        linear.weight, linear.bias = weight, self.bias
        return linear

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "Linear":
        """An fp8mp Linear sharing `linear`'s parameters (no copy)."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta", fp8_weight=False)
        new.weight, new.bias = linear.weight, linear.bias
        new.fp8_meta = new.new_fp8_meta(linear.weight.device)
        return new
