"""`TrainerConfig`: everything `fp8mp.Trainer` needs to know, from a plain dict, checked once.

    config = fp8mp.TrainerConfig.from_dict({"precision": "fp8_mixed", "fp8_format": "HYBRID", "lr": 3e-4,
                                            "keep_high_precision": ["lm_head"], "lora": {"rank": 8, "alpha": 16,
                                            "targets": ["qkv"]}})

Unknown keys and bad values raise ValueError naming the key (with the closest valid key, or the
allowed values). Lists become tuples and dicts tuples of pairs, so the config is frozen all the way down.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, fields

from fp8mp.scaling.recipe import (AMAX_COMPUTE_ALGOS, BlockScaling, CurrentScaling, DelayedScaling, Format, MXFP8Scaling,
                                  Recipe, RowwiseScaling)
from fp8mp.scaling.config_checks import check_int
from fp8mp.planning.plan import PrecisionPlan, as_plan

__all__ = ["TrainerConfig", "LoRAConfig"]

PRECISIONS = ("fp8_mixed", "bf16", "fp32")
FP8_FORMATS = ("E4M3", "HYBRID")  # E5M2 is refused, see _check_format
SCALINGS = ("delayed", "current", "rowwise", "block", "mxfp8")
ACTIVATION_DTYPES = ("bf16", "fp32")


def _unknown_key_error(owner: str, key, valid: list[str]) -> ValueError:
    close = difflib.get_close_matches(str(key), valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"{owner}: unknown key {key!r}{hint}. Valid keys: {', '.join(valid)}")


def _check_keys(owner: str, d, valid: list[str]) -> None:
    if not isinstance(d, dict):
        raise TypeError(f"{owner}: expected a dict, got {type(d).__name__}")
    for key in d:
        if key not in valid:
            raise _unknown_key_error(owner, key, valid)


def _check_choice(key: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"TrainerConfig: key '{key}' must be one of {list(choices)}, got {value!r}")


def _check_format(key: str, value) -> None:
    if value == "E5M2":
        raise ValueError(f"TrainerConfig: key '{key}' = 'E5M2' is refused: with E5M2 for every tensor the weight-gradient "
                         "GEMM would multiply two E5M2 operands (dY^T x X), which FP8 tensor cores do not run. Use "
                         "'HYBRID' (E4M3 forward, E5M2 gradients: the range E5M2 is wanted for) or 'E4M3'.")
    _check_choice(key, value, FP8_FORMATS)


def _check_int(key: str, value, minimum: int) -> None:
    check_int(f"TrainerConfig: key '{key}'", value, minimum)


def _check_number(key: str, value, minimum: float = 0.0, inclusive: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or value < minimum or (value == minimum and not inclusive):
        bound = ">=" if inclusive else ">"
        raise ValueError(f"TrainerConfig: key '{key}' must be a finite number {bound} {minimum}, got {value!r}")


def _check_bool(key: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"TrainerConfig: key '{key}' must be True or False, got {value!r}")


def _prefix_tuple(key: str, value) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(p, str) and p for p in value):
        raise ValueError(f"TrainerConfig: key '{key}' must be a list of non-empty module-name strings, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class LoRAConfig:
    """The "lora" entry: rank, alpha, targets (module-name substrings), fp8_base_weight (default False)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    fp8_base_weight: bool = False

    @classmethod
    def from_dict(cls, d) -> "LoRAConfig":
        valid = [f.name for f in fields(cls)]
        _check_keys("TrainerConfig key 'lora'", d, valid)
        missing = [k for k in ("rank", "alpha", "targets") if k not in d]
        if missing:
            raise ValueError(f"TrainerConfig: key 'lora' lacks {missing} (it needs rank, alpha and targets)")
        return cls(**d)

    def __post_init__(self) -> None:
        _check_int("lora.rank", self.rank, 1)
        _check_number("lora.alpha", self.alpha)
        targets = _prefix_tuple("lora.targets", self.targets)
        if not targets:
            raise ValueError("TrainerConfig: key 'lora.targets' must name at least one module-name substring")
        object.__setattr__(self, "targets", targets)
        _check_bool("lora.fp8_base_weight", self.fp8_base_weight)


@dataclass(frozen=True)
class TrainerConfig:
    """How `fp8mp.Trainer` converts, runs and optimizes a model (keys of `from_dict`, with defaults).

    Keys:
        precision: "fp8_mixed" (fp8mp.nn.Linear in FP8 inside fp8_autocast), "bf16" (torch.autocast bf16) or "fp32".
        fp8_format: "HYBRID" (E4M3 forward, E5M2 gradients) or "E4M3"; "E5M2" is refused.
        scaling: "delayed" (DelayedScaling: amax_history_len, amax_compute_algo, margin), "current" (margin), or
            a fine-grained recipe with its defaults: "rowwise" (RowwiseScaling), "block" (BlockScaling, DeepSeek-V3's
            1x128 / 128x128) or "mxfp8" (MXFP8Scaling, 1x32 E8M0); those ignore margin and the history keys.
        initial_scale, dynamic_loss_scaling, growth_interval: the LossScaler (disabled: a pass-through).
        lr, weight_decay: AdamW over the trainable parameters (when no optimizer is given).
        grad_clip: max global gradient norm, clipped in FP32 after unscaling; None: no clipping.
        activation_dtype: for "fp8_mixed", "bf16" runs the non-FP8 ops under torch.autocast(bf16), "fp32" not.
        format_overrides: {module-name prefix: "E4M3" | "HYBRID"}; a prefix matches a module's name or the names
            under it ("enc" matches "enc" and "enc.fc", not "encoder"); the longest matching prefix wins.
        keep_high_precision: module-name prefixes (same matching) whose Linear layers are not converted.
        plan: None, an fp8mp.PrecisionPlan, or the path of its JSON (loaded and checked here): convert applies it
            (`fp8mp.convert(model, plan=...)`: each planned layer pinned to its recipe, "bf16" layers kept). It
            decides per layer, so keep_high_precision and format_overrides are refused beside it; the recipe that
            scaling and fp8_format describe stays fp8_autocast's, for FP8 modules the plan does not pin.
        replan_every_steps: None, or re-measure the model every that many steps (`fp8mp.replan`, with the plan's
            candidates and budget) on the last `replan_batches` training batches, apply the layers whose choice
            changed in place and log them; needs `plan` (the plan to start from), and refuses `lora`. `trainer.plan`
            is then the plan the model trains under (save it beside a state_dict: it decides the model's modules);
            `fit` refuses checkpoint_dir with it, and the monitor keeps watching the FP8 modules it found at first.
        fallback, fallback_cooldown_steps: fp8mp.fallback.FallbackPolicy (layers that keep overflowing run in
            high precision for that many steps).
        monitor: attach an fp8mp.monitor.Fp8Monitor recording every `log_every` steps.
        lora: None, or {"rank", "alpha", "targets", optional "fp8_base_weight"} (see fp8mp.nn.lora).
        progress_bar: a tqdm bar in `fit`; log_every: steps between bar updates (and monitor records).
    """

    precision: str = "fp8_mixed"
    fp8_format: str = "HYBRID"
    scaling: str = "delayed"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    margin: int = 0
    initial_scale: float = 8192.0
    dynamic_loss_scaling: bool = True
    growth_interval: int = 2000
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    activation_dtype: str = "bf16"
    format_overrides: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    keep_high_precision: tuple[str, ...] = field(default_factory=tuple)
    fallback: bool = True
    fallback_cooldown_steps: int = 100
    monitor: bool = False
    lora: LoRAConfig | None = None
    plan: PrecisionPlan | None = None
    replan_every_steps: int | None = None
    replan_batches: int = 4
    progress_bar: bool = True
    log_every: int = 10

    @classmethod
    def from_dict(cls, d: dict) -> "TrainerConfig":
        """A config from a plain dict; missing keys take their defaults."""
        _check_keys("TrainerConfig", d, [f.name for f in fields(cls)])
        return cls(**d)

    def __post_init__(self) -> None:
        _check_choice("precision", self.precision, PRECISIONS)
        _check_format("fp8_format", self.fp8_format)
        _check_choice("scaling", self.scaling, SCALINGS)
        _check_int("amax_history_len", self.amax_history_len, 1)
        _check_choice("amax_compute_algo", self.amax_compute_algo, AMAX_COMPUTE_ALGOS)
        _check_int("margin", self.margin, 0)
        _check_number("initial_scale", self.initial_scale)
        _check_bool("dynamic_loss_scaling", self.dynamic_loss_scaling)
        _check_int("growth_interval", self.growth_interval, 1)
        _check_number("lr", self.lr)
        _check_number("weight_decay", self.weight_decay, inclusive=True)
        if self.grad_clip is not None:
            _check_number("grad_clip", self.grad_clip)
        _check_choice("activation_dtype", self.activation_dtype, ACTIVATION_DTYPES)
        self._freeze("format_overrides", self._overrides_tuple(self.format_overrides))
        self._freeze("keep_high_precision", _prefix_tuple("keep_high_precision", self.keep_high_precision))
        for key in ("fallback", "monitor", "progress_bar"):
            _check_bool(key, getattr(self, key))
        _check_int("fallback_cooldown_steps", self.fallback_cooldown_steps, 1)
        _check_int("log_every", self.log_every, 1)
        if self.plan is not None:
            self._freeze("plan", as_plan(self.plan, "TrainerConfig: key 'plan'"))
            beside = [key for key in ("keep_high_precision", "format_overrides") if getattr(self, key)]
            if beside:
                raise ValueError(f"TrainerConfig: key 'plan' decides each layer's precision; drop key {beside[0]!r} "
                                 "(or edit the plan's choices instead)")
        _check_int("replan_batches", self.replan_batches, 1)
        if self.replan_every_steps is not None:
            _check_int("replan_every_steps", self.replan_every_steps, 1)
            if self.plan is None or self.lora is not None:
                raise ValueError("TrainerConfig: key 'replan_every_steps' re-measures the layers a plan converted: "
                                 "give key 'plan' (the plan to start from), and no key 'lora'")
        if isinstance(self.lora, dict):
            self._freeze("lora", LoRAConfig.from_dict(self.lora))
        elif self.lora is not None and not isinstance(self.lora, LoRAConfig):
            raise ValueError(f"TrainerConfig: key 'lora' must be None or a dict with rank, alpha, targets, got {self.lora!r}")

    def _freeze(self, key: str, value) -> None:
        object.__setattr__(self, key, value)

    @staticmethod
    def _overrides_tuple(value) -> tuple[tuple[str, str], ...]:
        pairs = value.items() if isinstance(value, dict) else value
        if not isinstance(pairs, (tuple, list, type({}.items()))) or not all(
                isinstance(p, tuple) and len(p) == 2 for p in pairs):
            raise ValueError(f"TrainerConfig: key 'format_overrides' must be a dict {{module-name prefix: format}}, got {value!r}")
        for prefix, fmt in pairs:
            if not isinstance(prefix, str) or not prefix:
                raise ValueError(f"TrainerConfig: key 'format_overrides' has a bad prefix {prefix!r} (a non-empty module name)")
            _check_format(f"format_overrides[{prefix!r}]", fmt)
        return tuple(pairs)

    # ----------------------------------------------------------------------------- derived
    def fp8_recipe(self, fp8_format: str | None = None) -> Recipe:
        """The recipe this config describes, in `fp8_format` (default: the config's own)."""
        fmt = Format(fp8_format or self.fp8_format)
        if self.scaling == "current":
            return CurrentScaling(margin=self.margin, fp8_format=fmt)
        fine_grained = {"rowwise": RowwiseScaling, "block": BlockScaling, "mxfp8": MXFP8Scaling}
        if self.scaling in fine_grained:
            return fine_grained[self.scaling](fp8_format=fmt)
        return DelayedScaling(margin=self.margin, fp8_format=fmt, amax_history_len=self.amax_history_len,
                              amax_compute_algo=self.amax_compute_algo)
