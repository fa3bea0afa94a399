"""Per-module FP8 scaling state: amaxes, amax history, scales, as buffers.

A module that computes in FP8 owns one `Fp8Meta` with a column per FP8 tensor
it casts (for Linear: input, weight, grad_output). All columns are updated by
one op call per step (`update_amax_history_and_scale`), not a loop per tensor.
"""
from __future__ import annotations

import contextlib
import threading

import torch

from fp8mp.utils.dtensor import is_dtensor
from fp8mp.scaling.columns import GRAD, INPUT, WEIGHT, Fp8Columns, LinearTensor, columns_of, fold_amax_, tensor_amax  # noqa: F401
from fp8mp.scaling.recipe_registry import quantizer_for
from fp8mp.scaling.recipe import DelayedScaling, Recipe
from fp8mp.ops.format import FP8_MAX


_NO_LOCK = contextlib.nullcontext()


# A fresh module's history length: the default recipe's, the one most checkpoints are saved with.
DEFAULT_HISTORY_LEN = DelayedScaling().amax_history_len


def _upgrade_extra_state(state_dict: dict, prefix: str) -> dict:
    """Checkpoints of fp8mp 0.1.0 held the state as a dict under "<prefix>_extra_state": spell it as buffers."""
    legacy = state_dict.get(prefix + "_extra_state")
    if not isinstance(legacy, dict):
        return state_dict
    upgraded = {k: v for k, v in state_dict.items() if k != prefix + "_extra_state"}
    for name in ("amax", "amax_history", "scale", "scale_inv"):
        upgraded[prefix + name] = legacy[name]
    upgraded[prefix + "initialized"] = torch.tensor([bool(legacy["initialized"])])
    return upgraded


def keep_buffer_dtypes(module: torch.nn.Module, dtypes: dict[str, torch.dtype]) -> None:
    """Undo a dtype conversion of the named buffers (after `model.bfloat16()`, `model.to(dtype)`...)."""
    for name, dtype in dtypes.items():
        buffer = module._buffers.get(name)
        if buffer is not None and buffer.dtype != dtype:
            module._buffers[name] = buffer.to(dtype)


class Fp8Meta(torch.nn.Module):
    """Scaling buffers for `num_tensors` FP8 tensors of one module.

    Buffers in the state_dict (keys "<module>.fp8_meta.<name>"), so checkpoints in every format
    (torch.save with weights_only=True, safetensors, save_pretrained, torch.distributed.checkpoint)
    carry them and resumed training continues with the same scales, bit for bit.

    Saved buffers:
        amax [T]: newest amax of each tensor, written by the cast kernels.
        amax_history [H, T]: row 0 newest (delayed scaling). H starts at the default recipe's
            amax_history_len, so a fresh module has the shapes a checkpoint of a trained one has.
        scale [T], scale_inv [T]: what the next casts use; scale_inv == 1 / scale.
        initialized [1] bool: a forward has set the scales from the data.

    Buffers not saved:
        fp8_max [T]: the largest finite value of each tensor's format under the active recipe.
        step_amax [T]: max of every amax the casts that record gradients wrote since the last
            `take_nonfinite()` (NaN if one met a NaN): what fp8mp.LossScaler checks once per step.
    """

    def __init__(self, num_tensors: int, backward_tensors: tuple[int, ...], device=None,
                 history_len: int = DEFAULT_HISTORY_LEN):
        super().__init__()
        self.num_tensors = num_tensors
        self.backward_tensors = tuple(int(i) for i in backward_tensors)  # plain ints: see LinearTensor
        self.recipe: Recipe | None = None
        self.quantizer = None  # quantizer_for(self.recipe), set by configure()
        self._lock = threading.RLock()
        factory = dict(dtype=torch.float32, device=device)
        self.register_buffer("amax", torch.zeros(num_tensors, **factory))
        self.register_buffer("amax_history", torch.zeros(history_len, num_tensors, **factory))
        self.register_buffer("scale", torch.ones(num_tensors, **factory))
        self.register_buffer("scale_inv", torch.ones(num_tensors, **factory))
        # False until a first forward set scales from the data itself: delayed scaling would otherwise
        # cast step 0 with scale 1 and saturate anything above 448. The buffer is what checkpoints
        # hold; the Python mirror is what forwards read (reading the buffer would sync with the GPU).
        self.register_buffer("initialized", torch.zeros(1, dtype=torch.bool, device=device))
        self._initialized = False
        self.register_buffer("fp8_max", torch.ones(num_tensors, **factory), persistent=False)
        self.register_buffer("step_amax", torch.zeros(num_tensors, **factory), persistent=False)
        self._column_cache = None  # see columns()
        self._scales_prepared_in = None  # see prepare_gathered_weight_scale()

    # ------------------------------------------------------------ threads
    # Threads sharing a model must not interleave one module's scale update, the casts that use
    # the scales and the copies of scale_inv its GEMMs decode with: fp8mp modules hold this lock
    # from the update to the last use, in forward and in backward. An RLock, so a module may nest.

    def lock(self):
        """This module's scaling lock (a no-op context while torch.compile traces: a compiled graph
        takes no Python lock, so threads sharing a compiled FP8 model must take turns themselves)."""
        return _NO_LOCK if torch.compiler.is_compiling() else self._lock

    def backward_lock(self):
        """The lock the FP8 autograd functions' backward takes: this module's lock, or None while
        torch.compile traces (torch 2.11's dynamo cannot pass a context manager into autograd.Function)."""
        return None if torch.compiler.is_compiling() else self._lock

    def __getstate__(self) -> dict:  # a lock cannot be copied or pickled; a copy gets its own
        state = self.__dict__.copy()
        state.pop("_lock", None)
        state.pop("_column_cache", None)  # views of this module's buffers, not of the copy's
        state.pop("_scales_prepared_in", None)  # an open fp8_autocast context
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._lock = threading.RLock()
        self._column_cache = None
        if "quantizer" not in self.__dict__:  # (a module pickled before quantizers): configure() anew
            self.recipe = self.quantizer = None
        self._scales_prepared_in = None

    # ------------------------------------------------------------ what every FP8 linear call passes on
    def scaling_buffers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(scale, scale_inv, amax, step_amax), read from _buffers: `self.scale` is a Module.__getattr__ call
        (about 0.5 us) for a buffer."""
        buffers = self._buffers
        return buffers["scale"], buffers["scale_inv"], buffers["amax"], buffers["step_amax"]

    def columns(self) -> Fp8Columns | None:
        """Views of this module's columns (Fp8Columns), sliced once and reused while the buffers are the
        same tensors over the same memory: every FP8 linear call passes a dozen of them to its ops, and
        each slice is an op call of its own (about 1 us on CPU).

        None while torch.compile traces: the FP8 functions then slice the buffers in the graph, where a
        slice costs nothing. The views stay valid because the buffers are only written in place; what
        replaces one (a move, a dtype fix, load_state_dict(assign=True) or with swap_tensors, `.data =`)
        changes the tensor or its data pointer, both checked on every call. (Views hold their base, so
        torch.utils.swap_tensors called directly on a buffer refuses it while they are cached; load_state_dict
        drops them first.)
        """
        if torch.compiler.is_compiling():
            return None
        bases = self.scaling_buffers()
        pointers = (bases[0].data_ptr(), bases[1].data_ptr(), bases[2].data_ptr(), bases[3].data_ptr())
        cached = self._column_cache
        if (cached is None or cached[1] != pointers or cached[0][0] is not bases[0] or cached[0][1] is not bases[1]
                or cached[0][2] is not bases[2] or cached[0][3] is not bases[3]):
            cached = self._column_cache = (bases, pointers, columns_of(*bases))
        return cached[2]

    def _apply(self, fn, recurse=True):
        # Scales and amaxes stay fp32 whatever dtype the model is moved to: the ops require it, and a
        # bf16 scale would round. Device moves apply as usual.
        super()._apply(fn, recurse)
        keep_buffer_dtypes(self, {name: torch.float32 for name in self._FLOAT_BUFFERS})
        return self

    # ------------------------------------------------------------ checkpoints
    _FLOAT_BUFFERS = ("amax", "amax_history", "scale", "scale_inv", "fp8_max", "step_amax")
    STATE_KEYS = ("amax", "amax_history", "scale", "scale_inv", "initialized")

    def is_initialized(self) -> bool:
        return self._initialized

    def mark_initialized(self) -> None:
        if not self._initialized:
            self.initialized.fill_(True)
            self._initialized = True

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        state_dict = _upgrade_extra_state(state_dict, prefix)
        present = [name for name in self.STATE_KEYS if prefix + name in state_dict]
        if not present:
            # A plain torch checkpoint (nn.Linear, Conv1D, ...), or a partial load without this state: strict
            # loading passes and the state is reset, so the next forward scales from the data (as on step 0)
            # rather than from amaxes of other weights.
            self.reset_scaling()
            return
        # The cached views hold references to the buffers, which torch.utils.swap_tensors refuses to swap
        # (load_state_dict swaps under torch.__future__.set_swap_module_params_on_conversion(True)).
        self._column_cache = None
        history = state_dict.get(prefix + "amax_history")
        if history is not None and history.dim() == 2 and history.shape[1] == self.num_tensors:
            # The history length is the saving recipe's; adopt it rather than report a size mismatch.
            self.amax_history = self.amax_history.new_zeros(history.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if not self.initialized.is_meta:
            self._initialized = bool(self.initialized.item())
        self.recipe = self.quantizer = None  # the next forward re-reads formats; a history of matching length is kept

    def format_of(self, index: int) -> str:
        """The op format string ("e4m3"/"e5m2") of column `index` under the quantizer in use."""
        assert self.quantizer is not None
        return self.quantizer.formats[1 if index in self.backward_tensors else 0]

    def configure(self, recipe: Recipe) -> None:
        """Adopt `recipe` and its quantizer (`self.quantizer`, fp8mp/scaling/quantizer.py: the history length it
        keeps, the formats); a no-op when it is the recipe already in use."""
        if recipe is self.recipe:
            return
        if is_dtensor(self.fp8_max):
            raise TypeError("fp8mp: this module's FP8 scaling buffers (fp8_meta) are DTensors: torch's ColwiseParallel / "
                            "RowwiseParallel (distribute_module) replicate every buffer of the modules they shard. "
                            "Parallelize fp8mp Linear layers with fp8mp.nn.tensor_parallel.Fp8ColwiseParallel / "
                            "Fp8RowwiseParallel, which keep them plain tensors")
        quantizer = quantizer_for(recipe)
        # A quantizer without a history (current and block scaling) keeps whatever history there is (unused), so
        # checkpoint shapes do not depend on the recipe.
        history_len = quantizer.amax_history_len
        if history_len is not None and self.amax_history.shape[0] != history_len:
            self.amax_history = self.amax_history.new_zeros(history_len, self.num_tensors)
        self.recipe, self.quantizer = recipe, quantizer
        self.fp8_max.copy_(torch.tensor([FP8_MAX[self.format_of(i)] for i in range(self.num_tensors)]))

    def forward_buffers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(scale, scale_inv, amax, step_amax) as a forward's casts read and write them: step_amax, into which
        every cast's amax is folded, only when the forward records gradients (a training step LossScaler
        checks), else None."""
        scale, scale_inv, amax, step_amax = self.scaling_buffers()
        return scale, scale_inv, amax, step_amax if torch.is_grad_enabled() else None

    def reset_scaling(self) -> None:
        """Forget amaxes, history and scales: the next forward sets scales from the data, as on step 0."""
        with self.lock():
            self.amax.zero_()
            self.amax_history.zero_()
            self.scale.fill_(1.0)
            self.scale_inv.fill_(1.0)
            self.initialized.fill_(False)
            self._initialized = False

    def take_nonfinite(self) -> torch.Tensor:
        """[T] bool, on this module's device: whether each tensor's casts met an Inf or NaN since the
        last call (`step_amax`, which is then reset). No device->host sync."""
        with self.lock():
            flags = ~torch.isfinite(self.step_amax)
            self.step_amax.zero_()
        return flags
