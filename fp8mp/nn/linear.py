"""`fp8mp.nn.Linear`: a drop-in `torch.nn.Linear` that computes in FP8 inside `fp8_autocast`."""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from fp8mp.functions.linear import check_input, fp8_linear
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.parallel.sharded_linear import gathered_input, sharded_linear
from fp8mp.quantized import stored_weight as fp8_weight_storage
from fp8mp.quantized.stored_weight import STORED_WEIGHT_BUFFERS, StoredFp8Weight
from fp8mp.quantized.weight_operands import WeightOperands, weight_operands
from fp8mp.scaling import autocast as autocast_state
from fp8mp.utils.dtensor import is_dtensor


class Linear(Fp8Module, torch.nn.Linear):
    """y = x @ W.T + b, in FP8 inside `fp8mp.fp8_autocast`, in the parameters' precision outside it.

    Same constructor, parameters and state_dict keys as `torch.nn.Linear`, so its checkpoints load
    as they are. In FP8, input and weight are cast to the recipe's forward format (E4M3), the
    gradient of the output to its backward format (E5M2 for Format.HYBRID), and all three GEMMs
    (fprop, dgrad, wgrad) run in FP8 with fp32 accumulation. The output has the input's dtype, or
    under `torch.autocast` autocast's dtype, as nn.Linear's output does (fp8mp/functions/output_dtype.py);
    the input gradient has the input's dtype, the weight gradient the weight's.

    A frozen `weight` stored by `fp8mp.convert(model, frozen_weights="fp8")` is an Fp8FrozenWeight
    (fp8mp/quantized/frozen_weight.py): its E4M3 codes and scale go to the FP8 GEMM as they are.

    fp8_weight=True (default: True inside `fp8mp.fp8_model_init()`) stores the weight in FP8
    (buffers weight_fp8, weight_scale, weight_scale_inv; `weight` is None), for inference or frozen
    (`freeze_weight()`), or trained through FP32 masters held by the deprecated
    `fp8mp.optim.MasterWeightOptimizer`; see fp8mp/quantized/stored_weight.py. Under
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
        weight, stored = self.fp8_weight_operands(meta.quantizer)
        group = autocast_state.get_fp8_group()
        if is_dtensor(weight) or is_dtensor(input):  # tensor parallel: run on the local shards
            if stored is not None:
                raise NotImplementedError("fp8mp.nn.Linear: an FP8-stored or frozen FP8 weight under tensor parallel "
                                          "is not supported; keep the weight a high-precision parameter")
            return sharded_linear("fp8mp.nn.Linear", input, weight, self.bias, meta, group, ran_before)
        return fp8_linear(input, weight, self.bias, meta, stored=stored, group=group, ran_before=ran_before)

    def fp8_weight_operands(self, quantizer) -> WeightOperands:
        """(leaf, stored) of this layer's weight under `quantizer` (fp8mp/quantized/weight_operands.py): the weight
        parameter, whatever its form (plain, frozen FP8, FSDP2-gathered FP8), or the FP8 weight this layer
        stores in its buffers."""
        weight = self.weight
        return weight_operands(weight if weight is not None else self.stored_fp8_weight(), quantizer)

    def stored_fp8_weight(self) -> StoredFp8Weight:
        """The FP8 weight this layer stores (fp8_weight=True), as the weight interface offers it."""
        self._require_fp8_weight("stored_fp8_weight")
        buffers = {name: self._buffers[name] for name in self._fp8_weight_buffers}
        return StoredFp8Weight(buffers, self.fp8_weight_layout, self._fp8_weight_recipe, self._weight_grad_leaf)

    # ----------------------------------------------------------------------------- FP8 weight storage
    def store_weight_in_fp8(self, recipe=None) -> None:
        """Replace the `weight` parameter by FP8 buffers quantized for `recipe`.

        recipe: default this layer's fp8_recipe, else fp8_model_init's; per-tensor recipes (and None)
        give one current-scaling scale from the weight's amax, fine-grained ones their block scales.
        """
        recipe = recipe or self.fp8_recipe or fp8_weight_storage.model_init_recipe()
        weight = self.weight.detach()
        self.register_parameter("weight", None)
        self.fp8_weight_layout = fp8_weight_storage.stored_weight_layout(recipe)
        self._fp8_weight_recipe = recipe if self.fp8_weight_layout is not None else None
        for name, value in fp8_weight_storage.stored_weight_buffers(weight, self._fp8_weight_recipe).items():
            self.register_buffer(name, value)
        self._fp8_weight_buffers = tuple(name for name in STORED_WEIGHT_BUFFERS if name in self._buffers)

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
        buffers = {name: self._buffers[name] for name in self._fp8_weight_buffers}
        StoredFp8Weight(buffers, self.fp8_weight_layout, self._fp8_weight_recipe).quantize_from_(source)

    def decode_stored_weight(self, dtype: torch.dtype, master: torch.Tensor | None = None) -> torch.Tensor:
        """The stored FP8 weight decoded to `dtype` [N, K]; differentiable into `master` when one is given."""
        self._require_fp8_weight("decode_stored_weight")
        buffers = {name: self._buffers[name] for name in self._fp8_weight_buffers}
        stored = StoredFp8Weight(buffers, self.fp8_weight_layout, self._fp8_weight_recipe)
        return stored.decode(dtype, master, self.in_features)

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
