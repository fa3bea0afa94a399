"""`fp8_autocast`: the context in which fp8mp modules compute in FP8.

    with fp8mp.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling()):
        loss = model(x).sum()
    loss.backward()          # backward runs in FP8 too: modules remember their forward's recipe

Contexts nest (the innermost wins), restore the outer state on exceptions, and
record which fp8mp modules ran inside them (`ctx.modules`). Each thread has its own
contexts, as with torch.autocast.

With `fp8_group`, amaxes are reduced over the group so that every rank computes the
same scales: see fp8mp/scaling/distributed.py for what is reduced when.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from typing import Iterator

import torch

from fp8mp.scaling import distributed
from fp8mp.scaling.recipe import DelayedScaling, Format, Recipe

__all__ = ["fp8_autocast", "is_fp8_enabled", "get_fp8_recipe", "get_fp8_group", "Fp8AutocastState", "current_context",
           "ran_in_current_context",
           "take_unchecked_modules"]


@dataclasses.dataclass
class Fp8AutocastState:
    """One active `fp8_autocast` context."""

    enabled: bool
    recipe: Recipe
    fp8_group: object | None = None
    # Modules that ran a forward inside this context, by id (a dict keeps first-run order;
    # plain containers keep the context traceable by torch.compile).
    _modules: dict = dataclasses.field(default_factory=dict)

    @property
    def modules(self) -> list[torch.nn.Module]:
        return list(self._modules.values())


class _ThreadContexts(threading.local):
    """This thread's open fp8_autocast contexts, innermost last.

    Thread-local, as torch.autocast's state is: a serving or evaluation thread beside the training
    thread sees only its own contexts. Dynamo reads a threading.local attribute like any other and
    guards on it, so compiled code follows the calling thread's contexts without a graph break.
    """

    def __init__(self) -> None:
        self.stack: list[Fp8AutocastState] = []
        # id(module) -> (weakref, fp8_group) of the fp8mp modules that ran in FP8 with grad enabled in
        # this thread since the last take_unchecked_modules(): LossScaler checks their casts for Inf/NaN.
        self.unchecked: dict[int, tuple[weakref.ref, object]] = {}


_CONTEXTS = _ThreadContexts()


def validate_recipe(recipe: Recipe) -> Recipe:
    if not isinstance(recipe, Recipe):
        raise TypeError("argument 'fp8_recipe' must be a DelayedScaling, CurrentScaling, RowwiseScaling, BlockScaling "
                        f"or MXFP8Scaling, got {type(recipe).__name__}")
    if recipe.fp8_format == Format.E5M2:
        raise ValueError(
            "argument 'fp8_recipe': Format.E5M2 for every tensor needs E5M2 x E5M2 GEMMs, which FP8 tensor cores "
            "do not run; use Format.HYBRID (E4M3 forward, E5M2 gradients) or Format.E4M3"
        )
    return recipe


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, fp8_recipe: Recipe | None = None, fp8_group=None) -> Iterator[Fp8AutocastState]:
    """Run fp8mp modules in FP8 inside the block.

    Args:
        enabled: False runs the block in the modules' own precision (handy to switch FP8 with a flag).
        fp8_recipe: DelayedScaling (default), CurrentScaling, or a fine-grained recipe (RowwiseScaling,
            BlockScaling, MXFP8Scaling; those need no amax reduction, see fp8mp/scaling/recipe.py).
        fp8_group: torch.distributed ProcessGroup over which amaxes are reduced so that every rank
            computes the same scales (None: no reduction). Entering the context reduces, in one
            all_reduce, the amaxes left by the previous context with the same group; enter it
            outside torch.compile'd code (see fp8mp/scaling/distributed.py).
    Yields:
        The context's state; `state.modules` lists the fp8mp modules that ran inside it.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"argument 'enabled' must be a bool, got {type(enabled).__name__}")
    state = Fp8AutocastState(enabled, validate_recipe(fp8_recipe if fp8_recipe is not None else DelayedScaling()), fp8_group)
    if fp8_group is not None and enabled:
        if torch.compiler.is_compiling():
            raise RuntimeError("fp8_autocast(fp8_group=...) must be entered outside torch.compile'd code: compile the "
                               "model and call it inside the context (the amax reduction at entry runs in eager)")
        distributed.reduce_pending_amaxes(fp8_group)
    _CONTEXTS.stack.append(state)
    try:
        yield state
    finally:
        _CONTEXTS.stack.pop()
        if fp8_group is not None and enabled:
            distributed.remember_modules(fp8_group, state.modules)


def is_fp8_enabled() -> bool:
    """True inside an enabled fp8_autocast of this thread (the innermost context wins)."""
    stack = _CONTEXTS.stack
    return len(stack) > 0 and stack[-1].enabled  # len(): dynamo of torch 2.11 cannot trace bool(list)


def get_fp8_recipe() -> Recipe | None:
    stack = _CONTEXTS.stack
    return stack[-1].recipe if stack else None


def current_context() -> Fp8AutocastState | None:
    """This thread's innermost fp8_autocast context (None outside one)."""
    stack = _CONTEXTS.stack
    return stack[-1] if stack else None


def ran_in_current_context(module: torch.nn.Module) -> bool:
    """Whether `module` already ran in the innermost context (what `record_module` returns for its next call)."""
    stack = _CONTEXTS.stack
    return len(stack) > 0 and id(module) in stack[-1]._modules


def get_fp8_group():
    """The innermost context's `fp8_group` (None outside fp8_autocast or without a group)."""
    stack = _CONTEXTS.stack
    return stack[-1].fp8_group if stack else None


def take_unchecked_modules() -> list[tuple[torch.nn.Module, object]]:
    """(module, fp8_group) of every fp8mp module that ran in FP8 with grad enabled (a training forward)
    in this thread since the last call, and forgets them.

    fp8mp.LossScaler calls it once per iteration to check what those modules' casts met
    (`Fp8Meta.step_amax`, which a module's first such forward after a call resets).
    """
    unchecked, _CONTEXTS.unchecked = _CONTEXTS.unchecked, {}
    return [(module, group) for module, group in ((ref(), group) for ref, group in unchecked.values())
            if module is not None]


def record_module(module: torch.nn.Module) -> bool:
    """Called by fp8mp modules' forward: every enclosing context learns the module ran.

    Returns True when the module already ran in the innermost context (a repeated call in one step).
    Also runs under torch.compile (a dict update Dynamo replays after the graph), so the amaxes of
    compiled modules are reduced at the next `fp8_autocast(fp8_group=...)` entry too.
    """
    stack = _CONTEXTS.stack
    ran_before = ran_in_current_context(module)
    for state in stack:
        state._modules[id(module)] = module
    # Keyed by id(), which a new module may reuse from a dead one still listed: the entry is this module's
    # only if its weak reference is to this module.
    entry = _CONTEXTS.unchecked.get(id(module))
    if torch.is_grad_enabled() and (entry is None or entry[0]() is not module):
        _CONTEXTS.unchecked[id(module)] = (weakref.ref(module), get_fp8_group())
        module.fp8_meta.step_amax.zero_()  # a new step for LossScaler's check: earlier casts are not in it
    return ran_before
