"""FP8 scaling recipes, in Transformer Engine's vocabulary.

A recipe says how each FP8 tensor gets its scale. In every recipe

    scale = fp8_max / amax / 2**margin

maps the tensor's largest magnitude ``amax`` onto a point ``2**margin`` below
the format's largest finite value ``fp8_max`` (448 for E4M3, 57344 for E5M2),
so a larger margin trades precision for headroom against overflow. When amax
is 0, NaN or Inf (or the result is not a finite positive number) the previous
scale is kept: a step with an all-zero tensor or an overflow does not destroy
the scale. ``scale_inv = 1 / scale`` always.

Each recipe also says how its three FP8 GEMMs accumulate (``fp8_gemm_fprop``,
``fp8_gemm_dgrad``, ``fp8_gemm_wgrad``, each an :class:`MMParams`), with
Transformer Engine's defaults: fast accumulation for the forward GEMM, split
(periodically promoted fp32) accumulation for the two gradient GEMMs, whose
long sums over tokens lose most to a short accumulator.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from fp8mp.scaling.config_checks import check_int

__all__ = ["Format", "MMParams", "DelayedScaling", "CurrentScaling", "RowwiseScaling", "BlockScaling", "MXFP8Scaling",
           "AMAX_COMPUTE_ALGOS", "MXFP8_SCALE_MODES", "gemm_fast_accum"]

AMAX_COMPUTE_ALGOS = ("max", "most_recent")


class Format(enum.Enum):
    """Which FP8 format the forward and the backward pass use.

    E4M3: everything in E4M3 (more precision, max 448).
    E5M2: everything in E5M2 (more range, max 57344).
    HYBRID: E4M3 in the forward pass (inputs and weights), E5M2 for gradients
    in the backward pass, whose range is wider. The usual choice for training.
    """

    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"

    @property
    def forward_format(self) -> str:
        """Op format string ("e4m3"/"e5m2") of forward tensors (inputs and weights)."""
        return "e5m2" if self is Format.E5M2 else "e4m3"

    @property
    def backward_format(self) -> str:
        """Op format string ("e4m3"/"e5m2") of gradients."""
        return "e4m3" if self is Format.E4M3 else "e5m2"


def _check_format(value) -> None:
    if not isinstance(value, Format):
        raise ValueError(f"fp8_format must be a fp8mp.recipe.Format (E4M3, E5M2 or HYBRID), got {value!r}")


@dataclass(frozen=True)
class MMParams:
    """How one FP8 GEMM accumulates (Transformer Engine's ``recipe.MMParams``).

    Attributes:
        use_split_accumulator: True: Hopper's FP8 tensor cores hand their partial sums
            to a full fp32 accumulator every few K steps (more accurate); False: fast
            accumulation (cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM), which keeps the
            sums in the tensor core's narrower accumulator for the whole K loop (faster).
            The CPU kernels always accumulate in fp32.
    """

    use_split_accumulator: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.use_split_accumulator, bool):
            raise ValueError(f"use_split_accumulator must be a bool, got {self.use_split_accumulator!r}")


# Factories rather than shared default instances: torch.compile (Dynamo) cannot trace a
# dataclass __init__ whose defaults are objects of a user class, so DelayedScaling() inside a
# compiled region (fp8_autocast's default recipe) would break the graph.
def _fprop_default() -> MMParams:
    return MMParams(use_split_accumulator=False)


def _grad_default() -> MMParams:
    return MMParams(use_split_accumulator=True)

GEMM_FIELDS = ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad")


def _check_gemm_params(recipe) -> None:
    for name in GEMM_FIELDS:
        value = getattr(recipe, name)
        if not isinstance(value, MMParams):
            raise ValueError(f"{name} must be a fp8mp.recipe.MMParams, got {value!r}")


def gemm_fast_accum(recipe) -> tuple[bool, bool, bool]:
    """(fprop, dgrad, wgrad): whether each GEMM uses fast accumulation under `recipe`."""
    return tuple(not getattr(recipe, name).use_split_accumulator for name in GEMM_FIELDS)


@dataclass(frozen=True)
class DelayedScaling:
    """Delayed scaling: the scale used at step n comes from the amaxes of earlier steps.

    Each cast records its tensor's amax; after the step,
    :func:`fp8mp.update_amax_history_and_scale` pushes it into a rolling
    history of the last ``amax_history_len`` amaxes and computes the next
    scale, ``fp8_max / effective_amax / 2**margin``, where effective_amax is
    the max over the whole history (``amax_compute_algo="max"``, robust to
    spikes but slow to recover: a spike dominates until it leaves the window)
    or the newest amax (``"most_recent"``). An effective amax of 0, NaN or Inf
    keeps the previous scale (NaN/Inf are still recorded in the history).

    Attributes:
        margin: int >= 0; scales are divided by ``2**margin``.
        fp8_format: a :class:`Format`; HYBRID (default) is E4M3 forward, E5M2 backward.
        amax_history_len: int >= 1, the window length H.
        amax_compute_algo: "max" (default) or "most_recent".
        fp8_gemm_fprop, fp8_gemm_dgrad, fp8_gemm_wgrad: :class:`MMParams` of the forward,
            input-gradient and weight-gradient GEMMs (default: fast accumulation forward,
            split accumulation for both gradients, as Transformer Engine).
    """

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    fp8_gemm_fprop: MMParams = field(default_factory=_fprop_default)
    fp8_gemm_dgrad: MMParams = field(default_factory=_grad_default)
    fp8_gemm_wgrad: MMParams = field(default_factory=_grad_default)

    def __post_init__(self) -> None:
        check_int("margin", self.margin, 0)
        _check_format(self.fp8_format)
        _check_gemm_params(self)
        check_int("amax_history_len", self.amax_history_len, 1)
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {AMAX_COMPUTE_ALGOS}, got {self.amax_compute_algo!r}")


@dataclass(frozen=True)
class CurrentScaling:
    """Current (just-in-time) scaling: each tensor's scale comes from its own amax, every step.

    ``scale = fp8_max / amax(x) / 2**margin`` is computed from the tensor about
    to be cast (see :func:`fp8mp.scaling.current_scale`), so nothing is
    stale, at the price of an extra pass over the tensor to find its amax.
    An amax of 0, NaN or Inf keeps the previous scale.

    Attributes:
        margin: int >= 0; scales are divided by ``2**margin``.
        fp8_format: a :class:`Format`; HYBRID (default) is E4M3 forward, E5M2 backward.
        fp8_gemm_fprop, fp8_gemm_dgrad, fp8_gemm_wgrad: as on :class:`DelayedScaling`.
    """

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    fp8_gemm_fprop: MMParams = field(default_factory=_fprop_default)
    fp8_gemm_dgrad: MMParams = field(default_factory=_grad_default)
    fp8_gemm_wgrad: MMParams = field(default_factory=_grad_default)

    def __post_init__(self) -> None:
        check_int("margin", self.margin, 0)
        _check_format(self.fp8_format)
        _check_gemm_params(self)


# ------------------------------------------------------------------------ fine-grained (block) scaling
#
# These recipes scale each block of a GEMM operand by its own amax, computed from the tensor about to
# be cast (current-style: no history, no Fp8Meta scale). Their block geometry (block length along K, weight
# block rows, scale rule) is their quantizer's: fp8mp/scaling/recipe_registry.py. Every block lies along the GEMM's reduction
# axis K, so each GEMM gets its operands quantized along its own K: fprop x and W along K, dgrad dy
# and W.T along N, wgrad dy.T and x.T along M. The block GEMM sums each K chunk of exact FP8
# products in fp32 and multiplies it by its two scales (fp8mp.ops.block_scaled_gemm).
#
# fp8_group: nothing is reduced across ranks. A block's scale depends only on that block's values,
# and under data parallelism every rank quantizes its own activations and gradients (blocks never
# span ranks) and the same replicated weight (bit-identical input, so bit-identical scales); tensor
# parallel shards split along rows or K blocks keep whole blocks when shard sizes are multiples of
# the block. So fp8_autocast(fp8_group=...) accepts these recipes and reduces nothing for them.


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


@dataclass(frozen=True)
class RowwiseScaling:
    """One scale per row along each GEMM's K axis (torchao's "rowwise" recipe).

    Input and weight get one scale per row of K in fprop, grad_output one per row of N in dgrad
    (and W one per column), and wgrad quantizes dy and x along M. E4M3 everywhere by default.

    Attributes:
        power_of_2_scales: round each scale down to a power of two (exact dequantization; torchao's default).
        fp8_format: a :class:`Format`; E4M3 (default) or HYBRID (E5M2 gradients).
    """

    power_of_2_scales: bool = True
    fp8_format: Format = Format.E4M3

    def __post_init__(self) -> None:
        _check_bool("power_of_2_scales", self.power_of_2_scales)
        _check_format(self.fp8_format)



@dataclass(frozen=True)
class BlockScaling:
    """DeepSeek-V3's fine-grained scaling (TE's Float8BlockScaling): 1 x 128 tiles, 128 x 128 weight blocks.

    Activations and gradients get one scale per 1 x 128 tile along K, weights one per 128 x 128
    block, and the GEMM promotes its partial sums to fp32 every 128 elements of K. E4M3 everywhere
    by default.

    Attributes:
        power_of_2_scales: round each scale down to a power of two (TE's default on Hopper is True;
            DeepSeek-V3's is False, the default here).
        fp8_format: a :class:`Format`; E4M3 (default) or HYBRID.
    """

    power_of_2_scales: bool = False
    fp8_format: Format = Format.E4M3

    def __post_init__(self) -> None:
        _check_bool("power_of_2_scales", self.power_of_2_scales)
        _check_format(self.fp8_format)



MXFP8_SCALE_MODES = ("floor", "rceil")


@dataclass(frozen=True)
class MXFP8Scaling:
    """MXFP8 (OCP MX v1.0, TE's MXFP8BlockScaling): 1 x 32 blocks along K with E8M0 power-of-two scales.

    Attributes:
        scale_mode: "rceil" (default; NVIDIA's: the smallest power of two with amax / scale <= fp8_max)
            or "floor" (the OCP MX v1.0 rule: shared_exp = floor(log2(amax)) - emax_elem, which may
            clip the block's largest values to fp8_max).
        fp8_format: a :class:`Format`; E4M3 (default) or HYBRID (E5M2 gradients).
    """

    scale_mode: str = "rceil"
    fp8_format: Format = Format.E4M3

    def __post_init__(self) -> None:
        if self.scale_mode not in MXFP8_SCALE_MODES:
            raise ValueError(f"scale_mode must be one of {MXFP8_SCALE_MODES}, got {self.scale_mode!r}")
        _check_format(self.fp8_format)



# Any recipe fp8_autocast accepts (usable with isinstance).
Recipe = DelayedScaling | CurrentScaling | RowwiseScaling | BlockScaling | MXFP8Scaling
