"""Frozen weights stored in FP8: one byte a parameter, read as an ordinary high-precision tensor.

    model.requires_grad_(False)                                   # or freeze what is not trained
    fp8mp.convert(model, frozen_weights="fp8")                    # or fp8mp.nn.store_frozen_weights_in_fp8(model)
    model = peft.get_peft_model(model, LoraConfig(...))           # the adapters train; the base stays FP8

`Fp8FrozenWeight` is a tensor subclass (`torch.Tensor._make_wrapper_subclass`) that reports the
weight's original dtype (float32 / bfloat16 / float16), shape and device, but holds only

    codes      float8_e4m3fn, the weight's shape: 1 byte per element
    scale_inv  float32 [1] for a 2-D weight (one scale per tensor), [E] for a 3-D weight [E, ...] (one
               per leading index: per expert, for mixture-of-experts weights such as transformers'
               gate_up_proj [E, 2I, H])

with `weight ~= codes * scale_inv` and each scale from current scaling (448 / amax, the rule of
`fp8mp.scaling.current_scale`). What a reader gets:

- `w.shape`, `w.dtype`, `w.device`, `w.requires_grad` (False) are those of the original weight;
- every other op decodes: `F.linear(x, w)`, `w @ x`, `w.float()`, `w[0]`, `torch.grouped_mm(x, w, offs)`,
  `w.sum()` compute on `codes * scale_inv` in the reported dtype and return plain tensors;
- detach, alias, clone, `.to(device)` / `.to(dtype)` keep the FP8 storage (a dtype change changes only
  the reported dtype), so `model.to(...)`, `model.bfloat16()` and `nn.Parameter(w)` keep one byte a
  parameter; so do, on a 2-D (one-scale) weight, the ops FSDP2 shards and unshards with (split, slice,
  view, as_strided, new_zeros / new_empty / empty_like), so that `fully_shard` holds and all-gathers the
  codes, one byte an element (the FSDP2 hooks below);
- `w.copy_(src)` re-quantizes `src` (an Fp8FrozenWeight source is copied code for code), so
  `load_state_dict` of a high-precision checkpoint into a converted model works;
- other in-place writes (`add_`, `mul_`, `+=`, `zero_`, an optimizer's update) raise: the weight is
  frozen; `decode_frozen_weights(model)` turns it back into a high-precision parameter first.

fp8mp.nn.Linear gives the codes and scale to its FP8 GEMM as they are (no decode and re-cast): the
codes are exactly what a current-scaling cast of the decoded weight gives.

Checkpoints hold plain tensors: the state_dict of a module holding an Fp8FrozenWeight `name` has
`name` = the codes (float8_e4m3fn) and `name + "_scale_inv"` = the scales (float32), the layout of
Hugging Face's FP8 checkpoints (`weight` + `weight_scale_inv`). Loading such a state_dict restores the
codes and scales bit for bit; loading a plain high-precision `name` (no `_scale_inv` key) quantizes it.

Why a subclass and not buffers with `weight = None` (fp8mp.fp8_model_init): model code reads
`.weight` (init functions, weight tying, PEFT, `post_init`, printing), and a frozen weight needs no
autograd leaf of its own, so the subclass only has to decode for reads and refuse writes; the one
training path (bf16 parameters, fp8mp.optim.AdamW) never sees it.
"""
from __future__ import annotations

import hashlib

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_map_only

from fp8mp.ops.operand import Fp8Operand
from fp8mp.quantized.stored_weight import WEIGHT_DTYPE, quantize_weight_
from fp8mp.quantized.weight_operands import StoredOperands, WeightOperands

__all__ = ["Fp8FrozenWeight", "decode_frozen_weights", "tensor_bytes", "register_checkpoint_hooks", "SCALE_INV_SUFFIX",
           "REPORTED_DTYPES"]

SCALE_INV_SUFFIX = "_scale_inv"
REPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_aten = torch.ops.aten
# Ops whose result is the same weight (same codes): they keep the subclass.
_KEEP_OPS = {_aten.detach.default, _aten.alias.default, _aten.clone.default, _aten.lift_fresh.default}
# Ops FSDP2 shards, pads and unshards a parameter with: on a weight with one scale (2-D), their results are
# codes of that weight with that scale, so they keep the subclass too (a per-expert 3-D weight decodes).
_SHARD_VIEW_OPS = {_aten.split.Tensor, _aten.split_with_sizes.default, _aten.slice.Tensor, _aten.view.default,
                   _aten.as_strided.default}
_SHARD_NEW_OPS = {_aten.new_zeros.default, _aten.new_empty.default, _aten.empty_like.default}


class Fp8FrozenWeight(torch.Tensor):
    """A frozen weight held as E4M3 codes plus fp32 scale(s), read as its original dtype (module docstring)."""

    codes: torch.Tensor
    scale_inv: torch.Tensor

    @staticmethod
    def __new__(cls, codes: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype):
        return cls._make_wrapper_subclass(cls, codes.shape, dtype=dtype, device=codes.device,
                                                   requires_grad=False)

    def __init__(self, codes: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype):
        self.codes = codes
        self.scale_inv = scale_inv

    # ----------------------------------------------------------------------------- construction
    @classmethod
    @torch.no_grad()
    def from_tensor(cls, weight: torch.Tensor) -> "Fp8FrozenWeight":
        """`weight` (2-D, or 3-D with one scale per leading index; float32/bfloat16/float16) quantized to E4M3."""
        if isinstance(weight, Fp8FrozenWeight):
            return cls(weight.codes.clone(), weight.scale_inv.clone(), weight.dtype)
        if not isinstance(weight, torch.Tensor) or weight.dim() not in (2, 3) or weight.dtype not in REPORTED_DTYPES:
            raise TypeError("Fp8FrozenWeight.from_tensor: argument 'weight' must be a 2-D or 3-D float32, bfloat16 or "
                            f"float16 tensor, got {_describe(weight)}")
        groups = 1 if weight.dim() == 2 else weight.shape[0]
        codes = torch.empty(weight.shape, dtype=WEIGHT_DTYPE, device=weight.device)
        scale_inv = torch.ones(groups, dtype=torch.float32, device=weight.device)
        new = cls(codes, scale_inv, weight.dtype)
        new.quantize_from_(weight.detach())
        return new

    def quantize_from_(self, source: torch.Tensor) -> None:
        """In place: codes and scales = the current-scaling quantization of `source` (one scale per group);
        what `copy_(source)` does with a high-precision source."""
        scale = torch.ones_like(self.scale_inv)
        if self.codes.dim() == 2:
            quantize_weight_(source, self.codes, scale, self.scale_inv)
            return
        for e in range(self.codes.shape[0]):
            quantize_weight_(source[e], self.codes[e], scale[e:e + 1], self.scale_inv[e:e + 1])

    # ----------------------------------------------------------------------------- reading
    def decode(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """codes * scale_inv as a plain tensor of `dtype` (default the reported dtype), computed in fp32."""
        scale_inv = self.scale_inv.reshape(-1, *([1] * (self.codes.dim() - 1)))
        return (self.codes.to(torch.float32) * scale_inv).to(dtype or self.dtype)

    def fp8_operands_for(self, quantizer) -> WeightOperands:
        """The weight interface (fp8mp/quantized/weight_operands.py): a 2-D weight's codes and scale as they are
        under a quantizer taking per-tensor E4M3 codes (they are what a current-scaling cast of the decoded
        weight gives), with no gradient leaf; else the weight itself, which the call quantizes (decoded)."""
        if quantizer.per_tensor_format == "e4m3" and self.codes.dim() == 2:
            return WeightOperands(None, StoredOperands(Fp8Operand(self.codes, self.scale_inv.clone())))
        return WeightOperands(self, None)

    def numpy(self, *, force: bool = False):
        """The decoded weight as a NumPy array (Tensor.numpy reads the data pointer, which a wrapper has not)."""
        return self.decode().numpy(force=force)

    def tolist(self):
        """The decoded weight as nested lists."""
        return self.decode().tolist()

    def _stable_hash_for_caching(self) -> str:
        """torch.compile's cache key: what the compiled code depends on (metadata, not values)."""
        metadata = (type(self).__qualname__, str(self.dtype), tuple(self.shape), self.device.type,
                    tuple(self.codes.stride()), tuple(self.scale_inv.shape))
        return hashlib.blake2b(repr(metadata).encode(), digest_size=16).hexdigest()

    def __repr__(self) -> str:
        return (f"Fp8FrozenWeight(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device}, "
                f"codes={self.codes.dtype}, scale_inv={tuple(self.scale_inv.shape)})")

    # ----------------------------------------------------------------------------- subclass protocol
    def __tensor_flatten__(self):
        return ["codes", "scale_inv"], self.dtype

    @staticmethod
    def __tensor_unflatten__(inner_tensors, dtype, outer_size, outer_stride):
        return Fp8FrozenWeight(inner_tensors["codes"], inner_tensors["scale_inv"], dtype)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _KEEP_OPS:
            weight = args[0]
            if func is _aten.clone.default:
                return cls(weight.codes.clone(), weight.scale_inv.clone(), weight.dtype)
            return cls(weight.codes, weight.scale_inv, weight.dtype)
        if (func in _SHARD_VIEW_OPS or func in _SHARD_NEW_OPS) and isinstance(args[0], Fp8FrozenWeight) \
                and args[0].scale_inv.numel() == 1:
            weight = args[0]
            if func in _SHARD_NEW_OPS:  # a new tensor of codes (zeros or uninitialized) with the weight's scale
                codes = func(weight.codes, *args[1:], **{**kwargs, "dtype": WEIGHT_DTYPE})
                return cls(codes, weight.scale_inv.clone(), weight.dtype)
            codes = func(weight.codes, *args[1:], **kwargs)
            if isinstance(codes, (list, tuple)):
                return [cls(c, weight.scale_inv, weight.dtype) for c in codes]
            return cls(codes, weight.scale_inv, weight.dtype)
        if func is _aten._to_copy.default and isinstance(args[0], Fp8FrozenWeight):
            moved = _moved(args[0], kwargs)
            if moved is not None:
                return moved
        if func is _aten.copy_.default and isinstance(args[0], Fp8FrozenWeight):
            target, source = args[0], args[1]
            if isinstance(source, Fp8FrozenWeight) and source.scale_inv.shape == target.scale_inv.shape:
                target.codes.copy_(source.codes)
                target.scale_inv.copy_(source.scale_inv)
            else:
                source = source.decode() if isinstance(source, Fp8FrozenWeight) else source
                target.quantize_from_(source.to(target.codes.device).expand(target.shape))
            return target
        _refuse_writes(func, args, kwargs)
        args, kwargs = tree_map_only(Fp8FrozenWeight, lambda w: w.decode(), (args, kwargs))
        return func(*args, **kwargs)


    # ----------------------------------------------------------------------------- FSDP2's extension points
    # Under fully_shard each rank holds its rows of the codes (one byte an element) and the scale, and FSDP2
    # all-gathers the codes as bytes; the gathered weight is an Fp8FrozenWeight again, whose codes fp8mp.nn.Linear
    # takes as they are. Only 2-D (one-scale) weights get here: FSDP2 shards a per-expert 3-D one decoded.
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """This rank's codes (as bytes, padded to FSDP2's padded shard rows) and the scale_inv."""
        self._fsdp_whole_rows = outer_size[0]
        return (padded_shard_rows(self.codes, outer_size[0], mesh.size()).view(torch.uint8),), (self.scale_inv,)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """The unsharded frozen weight over the gathered codes (FSDP2 frees and refills them)."""
        (data,), (scale_inv,) = all_gather_outputs, metadata
        if out is not None:
            out.scale_inv.copy_(scale_inv)
            return None
        codes = data.view(WEIGHT_DTYPE)[:self._fsdp_whole_rows]
        return self.gathered_type()(codes, scale_inv.clone(), param_dtype), (data,)

    @staticmethod
    def gathered_type() -> type:
        """The type of the unsharded weight FSDP2's all-gather of such a shard makes."""
        return Fp8FrozenWeight


def padded_shard_rows(codes: torch.Tensor, whole_rows: int, shards: int) -> torch.Tensor:
    """`codes` (a shard of a tensor of `whole_rows` rows split in `shards` by FSDP2) zero-padded to FSDP2's padded
    shard rows, ceil(whole_rows / shards): what its all-gather takes from every rank."""
    rows = -(-whole_rows // shards)
    if codes.shape[0] == rows:
        return codes
    padded = codes.new_zeros((rows, *codes.shape[1:]))
    padded[:codes.shape[0]].copy_(codes)
    return padded


def _moved(weight: Fp8FrozenWeight, kwargs) -> Fp8FrozenWeight | None:
    """`weight.to(device=..., dtype=...)` keeping FP8 storage; None where the target dtype is not a reported one."""
    dtype = kwargs.get("dtype") or weight.dtype
    if dtype not in REPORTED_DTYPES:
        return None
    device = kwargs.get("device") or weight.device
    return Fp8FrozenWeight(weight.codes.to(device), weight.scale_inv.to(device), dtype)


def _refuse_writes(func, args, kwargs) -> None:
    schema = func._schema
    for index, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        if isinstance(value, Fp8FrozenWeight):
            raise RuntimeError(
                f"{schema.name}: this weight is a frozen FP8 weight (fp8mp.nn.Fp8FrozenWeight) and cannot be "
                "written in place; copy_() re-quantizes a new value, or call "
                "fp8mp.nn.decode_frozen_weights(model) to make it a high-precision parameter first (e.g. before "
                "merging LoRA adapters or training it)")


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}-D {value.dtype} tensor"
    return type(value).__name__


# ------------------------------------------------------------------------------ bytes
def tensor_bytes(tensors) -> int:
    """Bytes of the storages behind `tensors` (an iterable), each storage counted once; a traceable wrapper
    subclass (Fp8FrozenWeight, torchao's tensors) counts the storages of its inner tensors (`__tensor_flatten__`)."""
    seen, total = set(), 0
    stack = list(tensors)
    while stack:
        tensor = stack.pop()
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            stack.extend(getattr(tensor, name) for name in names)
            continue
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


# ------------------------------------------------------------------------------ checkpoints
def _state_dict_hook(module, state_dict, prefix, local_metadata) -> None:
    """The state_dict holds plain tensors: an Fp8FrozenWeight `name` becomes its codes plus `name_scale_inv`."""
    for name, param in module._parameters.items():
        if isinstance(param, Fp8FrozenWeight) and prefix + name in state_dict:
            state_dict[prefix + name] = param.codes.detach()
            state_dict[prefix + name + SCALE_INV_SUFFIX] = param.scale_inv.detach()


def _load_state_dict_pre_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
    """Codes plus `name_scale_inv` load bit for bit (as an Fp8FrozenWeight source of copy_); a plain
    high-precision `name` is quantized by copy_."""
    for name, param in module._parameters.items():
        if not isinstance(param, Fp8FrozenWeight):
            continue
        scale_key = prefix + name + SCALE_INV_SUFFIX
        if scale_key in state_dict:
            scale_inv = state_dict.pop(scale_key)
            codes = state_dict.get(prefix + name)
            if isinstance(codes, torch.Tensor) and codes.dtype == WEIGHT_DTYPE:
                state_dict[prefix + name] = Fp8FrozenWeight(codes, scale_inv.to(torch.float32), param.dtype)
            else:
                error_msgs.append(f"{prefix + name}: {scale_key} needs {prefix + name} in {WEIGHT_DTYPE}, got "
                                  f"{_describe(codes)}")


def register_checkpoint_hooks(module: torch.nn.Module) -> None:
    """Make `module`'s state_dict hold its Fp8FrozenWeight parameters as codes plus `name_scale_inv` (plain
    tensors), and load them back from such a state_dict or from a high-precision one (once per module)."""
    if getattr(module, "_fp8_frozen_hooks", False):
        return
    module.register_state_dict_post_hook(_state_dict_hook)
    module.register_load_state_dict_pre_hook(_load_state_dict_pre_hook)
    module._fp8_frozen_hooks = True


def decode_frozen_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Replace, in place, every Fp8FrozenWeight parameter of `model` by a plain frozen `nn.Parameter` of its
    decoded values (in `dtype`, default the reported dtype): before merging LoRA adapters into the base, or
    to train those weights. Shared parameters stay shared. Returns `model`."""
    decoded: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if isinstance(param, Fp8FrozenWeight):
                if id(param) not in decoded:
                    decoded[id(param)] = torch.nn.Parameter(param.decode(dtype), requires_grad=False)
                module._parameters[name] = decoded[id(param)]
    return model
