"""FP8 storage for what norms and activation functions save for backward (COAT's per-group FP8 activations).

A transformer block keeps, for backward, the inputs of its norms (the residual stream, fp32 under
torch.autocast since layer_norm runs in fp32) and of its activation functions (the MLP's widest tensor),
besides the Linear inputs that fp8mp's FP8 Linear already stores in FP8. `enable_fp8_saved_activations`
(or ``fp8mp.convert(model, fp8_saved_activations=True)``) stores the activation functions' in FP8: E4M3 with one fp32
scale per group of 128 consecutive elements along the last dimension (COAT's "group scaling",
arXiv 2410.19313, with fp8mp.ops.block_quantize's 1 x 128 tiles and its "fp32" scale mode), so each
element costs 1 + 4/128 bytes instead of 4 (fp32) or 2 (bf16), and backward reads back each element
within half an E4M3 spacing of its value: ``|x' - x| <= 2^-4 |x|``, or ``2^-10 / scale`` for elements
below E4M3's normal range in their group (``scale = 448 / group amax``).

Norms store theirs in bf16 by default (``norm_format="bf16"``: an fp32 tensor rounded once to bf16, a bf16 or
fp16 one kept as it is), in E4M3 as above with ``norm_format="e4m3"``. Why: a norm's weight gradient sums
``dy * xhat`` over the tokens, and E4M3's spacing (2^-4) in xhat leaves it about 2% off, ten times bf16's error
(fp32 sums of bf16 values); on a tiny Llama trained 200 steps (benchmarks/loss_parity_memory_lean.py) E4M3-stored
norms cost about one point of final loss, FP8-stored activation-function inputs a fraction of that. bf16 costs
2 bytes an element instead of 1 + 4/128; under a bf16 model, where HF's RMSNorm saves its input upcast to fp32
(bf16 values), bf16 storage is exact and halves those bytes.

The mechanism fits any model: forward pre/post hooks on each chosen module enter
`torch.autograd.graph.saved_tensors_hooks` around its forward, so every tensor the module's ops save
passes through the pack hook. It is stored in FP8 when it is a float32/bfloat16/float16 tensor that
is neither an nn.Parameter nor a leaf that requires grad (nor a view of one: those stay referenced
anyway, so a copy would only add bytes) nor an expanded view, with at least 1/8 of the elements of
the call's largest floating input (so per-row statistics such as LayerNorm's mean and rstd, 1/H of
it, stay exact). Every other saved tensor is kept as it is. A tensor saved twice within one call
(RMSNorm written in torch ops saves its input for ``pow`` and for ``mul``) is stored once. Backward
gets the stored tensor back with its shape and dtype, contiguous (as from
`torch.autograd.graph.save_on_cpu`).

Which modules (`is_fp8_saved_activation_module`):

* norms: every module whose class name ends in "LayerNorm" or "RMSNorm" (torch's, fp8mp's, and the
  transformers families: LlamaRMSNorm, T5LayerNorm, ...), and fp8mp.nn.LayerNormLinear;
* activation functions: torch.nn's (torch.nn.modules.activation: GELU, SiLU, ReLU, Tanh, GLU, ...,
  not MultiheadAttention nor the softmax family), every module of transformers.activations (ACT2FN's
  GELUActivation, NewGELUActivation, SiLUActivation, ...), and every module whose class name ends in
  "GLU" (gated activations such as SwiGLU modules);
* and the subclasses of all these.

How it composes:

* torch.autocast and fp8_autocast: the hooks see whatever the ops save (FP8 Linears save FP8, which
  is not stored again); the quantization and its inverse are dtype-preserving.
* Saved-tensor hooks do not stack (the innermost pair alone applies), so the pack hook hands what it
  stores (the FP8 data and its scales, or the tensor it keeps) to the hooks that were active when the
  module started (`torch.utils.checkpoint`'s, `torch.autograd.graph.save_on_cpu`, a counter): inside a
  non-reentrant checkpoint nothing is kept, the FP8 data is recomputed, and backward reads the same bits.
* torch.compile: while compiling the hooks do nothing (the compiled graph's partitioner decides what
  is saved), so a compiled model runs exactly as without them.
* Threads: the hooks keep their per-call state in a thread-local stack; torch's saved-tensor hooks
  are thread-local too, so no global state changes.
* Double backward (create_graph=True) differentiates through the FP8-rounded values.
* DTensors (a norm under tensor parallel's SequenceParallel): each rank stores its local shard, and backward gets
  a DTensor of the same layout back; sharded along the sequence, the groups are the whole tensor's.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from fp8mp.ops.blockwise import block_dequantize, block_quantize
from fp8mp.utils.dtensor import from_local, is_dtensor

__all__ = ["enable_fp8_saved_activations", "disable_fp8_saved_activations", "has_fp8_saved_activations",
           "is_fp8_saved_activation_module", "fp8_saved_bytes_per_element", "GROUP_SIZE", "SAVED_FORMAT",
           "NORM_FORMATS"]

GROUP_SIZE = 128  # elements per fp32 scale, along the last dimension
SAVED_FORMAT = "e4m3"
# What norms store (enable_fp8_saved_activations's norm_format): bf16 (the default) or SAVED_FORMAT.
NORM_FORMATS = ("bf16", SAVED_FORMAT)
# Stored in FP8 only from these dtypes (float8 tensors, e.g. an FP8 Linear's saved input, stay as they are).
STORED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A saved tensor with fewer than 1/STATISTICS_FRACTION of the call's largest input's elements is kept:
# per-row statistics (mean, rstd: 1/H of the input) are tiny, and backward divides by them.
STATISTICS_FRACTION = 8

NORM_SUFFIXES = ("LayerNorm", "RMSNorm")
GATED_SUFFIX = "GLU"
# torch.nn.modules.activation holds these too, but they are no element-wise activation functions.
NOT_ACTIVATIONS = (torch.nn.MultiheadAttention, torch.nn.Softmax, torch.nn.Softmin, torch.nn.Softmax2d,
                   torch.nn.LogSoftmax)

ModuleFilter = Callable[[str, torch.nn.Module], bool]


def fp8_saved_bytes_per_element(last_dim: int) -> float:
    """Bytes per element of a tensor stored by :func:`quantize_saved` whose last dimension is `last_dim`: 1 byte of
    E4M3 plus one 4-byte scale per group (ceil(last_dim / 128) groups a row; a last dimension under 128
    is grouped with the rest of the tensor, 128 elements a group)."""
    if last_dim < GROUP_SIZE:
        return 1 + 4 / GROUP_SIZE
    return 1 + 4 * -(-last_dim // GROUP_SIZE) / last_dim


def is_fp8_saved_activation_module(module: torch.nn.Module) -> bool:
    """Whether `enable_fp8_saved_activations` hooks `module`: a norm or an activation function (module docstring)."""
    if isinstance(module, NOT_ACTIVATIONS):
        return False
    for cls in type(module).__mro__:  # a subclass of a chosen module is chosen too
        if _is_norm_class(cls) or cls.__name__.endswith(GATED_SUFFIX):
            return True
        if cls.__module__ in ("torch.nn.modules.activation", "transformers.activations"):
            return True
    return False


def _is_norm_class(cls: type) -> bool:
    return cls.__name__.endswith(NORM_SUFFIXES) or cls.__name__ == "LayerNormLinear"


def is_norm_module(module: torch.nn.Module) -> bool:
    """Whether `module` is one of the norms of `is_fp8_saved_activation_module` (their storage: norm_format)."""
    return any(_is_norm_class(cls) for cls in type(module).__mro__)


class _StoredPieces:
    """The tensors the pack hook stored for one saved tensor, handed to the enclosing hooks where there are any.
    `pieces()` gives them back, each through the enclosing unpack once: an enclosing hook may hand back each of
    its packed objects only once (a checkpoint does), and one stored tensor may be unpacked by two nodes (a tensor
    saved twice in one call), so what it gave is kept."""

    __slots__ = ("stored", "outer_unpack", "unpacked")

    def __init__(self, pieces: tuple[torch.Tensor, ...], outer_pack, outer_unpack):
        self.stored = pieces if outer_pack is None else tuple(outer_pack(piece) for piece in pieces)
        self.outer_unpack = outer_unpack
        self.unpacked = None

    def pieces(self) -> tuple:
        if self.outer_unpack is None:
            return self.stored
        if self.unpacked is None:
            self.unpacked = tuple(self.outer_unpack(piece) for piece in self.stored)
        return self.unpacked


class Fp8SavedTensor(_StoredPieces):
    """What the pack hook stores for one saved tensor: E4M3 data [rows, cols] and fp32 scale_inv
    [rows, ceil(cols / 128)], and the tensor's shape and dtype."""

    __slots__ = ("shape", "dtype", "dtensor_layout")

    def __init__(self, data, scale_inv, shape: torch.Size, dtype: torch.dtype, outer_pack, outer_unpack,
                 dtensor_layout=None):
        super().__init__((data, scale_inv), outer_pack, outer_unpack)
        self.shape, self.dtype = shape, dtype
        # A DTensor's (mesh, placements, global shape, stride): its local tensor is what is stored (`shape` is
        # the local one), and backward gets a DTensor of that layout back.
        self.dtensor_layout = dtensor_layout

    def tensor(self) -> torch.Tensor:
        """The stored tensor, decoded (a DTensor again where one was saved)."""
        values = dequantize_saved(*self.pieces(), self.shape, self.dtype)
        if self.dtensor_layout is None:
            return values
        mesh, placements, shape, stride = self.dtensor_layout
        return from_local(values, mesh, placements, shape, stride)


class Bf16SavedTensor(_StoredPieces):
    """What the pack hook stores for one fp32 tensor saved by a norm under norm_format="bf16": the tensor rounded
    once to bf16; backward reads it back as fp32."""

    __slots__ = ()

    def __init__(self, data, outer_pack, outer_unpack):
        super().__init__((data,), outer_pack, outer_unpack)

    def tensor(self) -> torch.Tensor:
        return self.pieces()[0].float()


def quantize_saved(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scale_inv): `x` as E4M3 in 1 x 128 groups along its last dimension (a last dimension under
    128: along the flattened tensor), one fp32 scale per group (fp8mp.ops.block_quantize, "fp32" mode)."""
    cols = x.shape[-1] if x.dim() >= 1 and x.shape[-1] >= GROUP_SIZE else x.numel()
    return block_quantize(x.detach().reshape(-1, cols), 1, GROUP_SIZE, SAVED_FORMAT, "fp32")


def dequantize_saved(data: torch.Tensor, scale_inv: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """The tensor `quantize_saved` stored: fp32(data) * its group's scale_inv, rounded once to `dtype`."""
    rows, cols = data.shape
    if cols % GROUP_SIZE:
        values = block_dequantize(data, scale_inv, 1, GROUP_SIZE)
    else:  # whole groups: broadcast each scale over its group (block_dequantize's arithmetic, no per-element scales)
        values = data.float().view(rows, cols // GROUP_SIZE, GROUP_SIZE).mul_(scale_inv.unsqueeze(-1))
    return values.to(dtype).view(shape)


def _owner(x: torch.Tensor) -> torch.Tensor:
    return x._base if x._base is not None else x


class _Call:
    """One forward of a hooked module: its saved-tensor hooks, the enclosing pair, and what it stored."""

    def __init__(self, min_numel: int, outer: tuple[Callable, Callable] | None, storage: str):
        self.min_numel = min_numel
        self.storage = storage  # SAVED_FORMAT, or "bf16" (a norm's)
        self.outer_pack, self.outer_unpack = outer if outer is not None else (None, None)
        # (address, shape, strides, dtype) -> (tensor, version, packed): the tensor is held so that its
        # memory is not reused for another tensor within the call.
        self.stored: dict[tuple, tuple[torch.Tensor, int, Any]] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def stores(self, x: torch.Tensor) -> bool:
        """Whether pack stores `x` in the call's storage (E4M3 or bf16) rather than keeping it as it is."""
        owner = _owner(x)
        if isinstance(owner, torch.nn.Parameter) or (owner.is_leaf and owner.requires_grad):
            return False
        # An expanded view (a zero stride) would cost more in FP8 than the storage it reads.
        expanded = any(stride == 0 and size > 1 for size, stride in zip(x.shape, x.stride()))
        # bf16 storage rounds fp32 tensors only (a bf16 or fp16 one costs no more kept as it is)
        dtypes = STORED_DTYPES if self.storage == SAVED_FORMAT else (torch.float32,)
        return x.dtype in dtypes and x.numel() >= max(self.min_numel, 1) and not expanded

    def pack(self, x: torch.Tensor) -> Any:
        if not self.stores(x):
            return ("kept", self.outer_pack(x) if self.outer_pack is not None else x.detach())
        local, layout = x, None
        if is_dtensor(x):  # (a norm under sequence parallel): store the local shard, its groups the whole tensor's
            with torch.no_grad():
                local = x.to_local()
            layout = (x.device_mesh, x.placements, x.shape, x.stride())
        key = (local.data_ptr(), x.shape, x.stride(), x.dtype)
        seen = self.stored.get(key)
        if seen is not None and seen[1] == x._version:
            return seen[2]
        if self.storage == "bf16":  # (a DTensor stays one: the cast is elementwise)
            packed = Bf16SavedTensor(x.detach().to(torch.bfloat16), self.outer_pack, self.outer_unpack)
        else:
            packed = Fp8SavedTensor(*quantize_saved(local), local.shape, x.dtype, self.outer_pack, self.outer_unpack,
                                    layout)
        self.stored[key] = (x, x._version, packed)
        return packed

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, (Fp8SavedTensor, Bf16SavedTensor)):
            return packed.tensor()
        kept = packed[1]
        return self.outer_unpack(kept) if self.outer_unpack is not None else kept


_active = threading.local()  # per thread: the stack of running calls (_Call, or None for a call without grad)


def _stack() -> list:
    stack = getattr(_active, "calls", None)
    if stack is None:
        stack = _active.calls = []
    return stack


def _largest_floating_numel(args, kwargs) -> int:
    values = list(args) + list(kwargs.values())
    return max((v.numel() for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()), default=0)


class SavedActivationHooks:
    """The forward pre-hook and forward hook of one module; `handles` removes both."""

    def __init__(self, module: torch.nn.Module, storage: str = SAVED_FORMAT):
        self.storage = storage  # SAVED_FORMAT, or "bf16" (see _Call)
        self.handles = (module.register_forward_pre_hook(self.before_forward, with_kwargs=True),
                        module.register_forward_hook(self.after_forward, always_call=True))

    def before_forward(self, module, args, kwargs):
        if torch.compiler.is_compiling():
            return None
        call = None
        if torch.is_grad_enabled():
            # torch has no public way to read the enclosing pair (torch.utils.checkpoint reads it the same way).
            outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
            call = _Call(_largest_floating_numel(args, kwargs) // STATISTICS_FRACTION, outer, self.storage)
            try:
                call.hooks.__enter__()
            except RuntimeError:  # saved-tensor hooks are disabled here (torch.autograd.graph.disable_saved_tensors_hooks)
                call = None
        _stack().append(call)
        return None

    def after_forward(self, module, args, output):
        if torch.compiler.is_compiling():
            return None
        call = _stack().pop()
        if call is not None:
            call.hooks.__exit__(None, None, None)
            call.stored.clear()
        return None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _hooks_of(module: torch.nn.Module) -> SavedActivationHooks | None:
    for hook in module._forward_pre_hooks.values():
        owner = getattr(hook, "__self__", None)
        if isinstance(owner, SavedActivationHooks):
            return owner
    return None


def has_fp8_saved_activations(module: torch.nn.Module) -> bool:
    """Whether `module` itself stores what it saves for backward in FP8 (enable_fp8_saved_activations hooked it)."""
    return _hooks_of(module) is not None


def _check_model(model, fn: str) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fp8mp.memory.saved_activations.{fn}: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")


def enable_fp8_saved_activations(model: torch.nn.Module, module_filter: ModuleFilter | None = None,
                                 norm_format: str = "bf16") -> torch.nn.Module:
    """Make every activation-function module of `model` (`model` itself included) store what it saves for
    backward in FP8, and every norm in `norm_format` (module docstring); returns `model`. Idempotent: a module
    already hooked keeps its storage.

    module_filter: ``f(fully_qualified_name, module) -> bool``; modules for which it returns False are left alone.
    norm_format: what norms store, one of NORM_FORMATS: "bf16" (default) or "e4m3".
    """
    _check_model(model, "enable_fp8_saved_activations")
    if module_filter is not None and not callable(module_filter):
        raise TypeError("fp8mp.memory.saved_activations.enable_fp8_saved_activations: argument 'module_filter' must be callable as "
                        "module_filter(name, module) -> bool")
    if norm_format not in NORM_FORMATS:
        raise ValueError(f"fp8mp.memory.saved_activations.enable_fp8_saved_activations: argument 'norm_format' must be one of "
                         f"{NORM_FORMATS}, got {norm_format!r}")
    for name, module in model.named_modules():
        if not is_fp8_saved_activation_module(module) or has_fp8_saved_activations(module):
            continue
        if module_filter is None or module_filter(name, module):
            SavedActivationHooks(module, norm_format if is_norm_module(module) else SAVED_FORMAT)
    return model


def disable_fp8_saved_activations(model: torch.nn.Module) -> torch.nn.Module:
    """Remove what enable_fp8_saved_activations added to `model` and its submodules; returns `model`."""
    _check_model(model, "disable_fp8_saved_activations")
    for module in model.modules():
        hooks = _hooks_of(module)
        if hooks is not None:
            hooks.remove()
    return model
