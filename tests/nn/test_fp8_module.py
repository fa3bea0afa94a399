"""Fp8Module, the base of fp8mp's FP8 modules: one prologue (record, fallback, lock, configure), the state
every such module owns, and the training system and conversion finding FP8 modules by the base alone."""
from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import fp8mp
from fp8mp.nn import Fp8Module
from fp8mp.scaling import autocast as autocast_state
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling
from fp8mp.training.fallback import FallbackPolicy
from fp8mp.training.monitor import Fp8Monitor


class ScaledIdentity(Fp8Module):
    """A module of the kind still to come: it writes down, per call, which hook ran and in what state."""

    def __init__(self):
        super().__init__()
        self.init_fp8_state()
        self.calls = []

    def check_input(self, input):
        if input.dim() == 0:
            raise ValueError("ScaledIdentity: argument 'input' must have a dimension")

    def high_precision_forward(self, input):
        self.calls.append(("high_precision",))
        return input * 2

    def fallback_forward(self, input):
        self.calls.append(("fallback", self.fp8_meta._lock._is_owned(), self.fp8_meta.recipe, self.recorded()))
        return input * 2

    def fp8_forward(self, input, ran_before):
        self.calls.append(("fp8", self.fp8_meta._lock._is_owned(), self.fp8_meta.recipe, self.recorded(), ran_before))
        return input * 2

    def recorded(self) -> bool:
        return any(id(self) in state._modules for state in autocast_state._CONTEXTS.stack)

    def to_torch(self):
        return torch.nn.Identity()


def test_fp8_modules_share_the_base():
    assert isinstance(fp8mp.nn.Linear(16, 16), Fp8Module)
    assert isinstance(fp8mp.nn.Conv1D(16, 16), Fp8Module)
    assert isinstance(fp8mp.nn.LayerNormLinear(16, 16).linear, Fp8Module)
    assert not isinstance(fp8mp.nn.LayerNorm(16), Fp8Module)  # no FP8 state of its own


def test_the_prologue_records_then_locks_and_configures_before_the_fp8_forward():
    module, recipe = ScaledIdentity(), CurrentScaling()
    x = torch.ones(3)
    module(x)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        module(x)
        module(x)
    assert module.calls == [("high_precision",), ("fp8", True, recipe, True, False), ("fp8", True, recipe, True, True)]


def test_the_prologue_falls_back_before_it_locks_or_configures():
    module = ScaledIdentity()
    module.fp8_fallback = True
    with fp8mp.fp8_autocast(fp8_recipe=CurrentScaling()):
        module(torch.ones(3))
    assert module.calls == [("fallback", False, None, True)]


def test_a_module_recipe_wins_over_fp8_autocasts():
    module, own = ScaledIdentity(), DelayedScaling(amax_history_len=4)
    module.fp8_recipe = own
    with fp8mp.fp8_autocast(fp8_recipe=CurrentScaling()):
        module(torch.ones(3))
    assert module.calls[0][2] is own and module.fp8_meta.amax_history.shape == (4, module.FP8_TENSORS)


def test_the_input_is_checked_inside_fp8_autocast_only_before_anything_else():
    module = ScaledIdentity()
    with fp8mp.fp8_autocast(), pytest.raises(ValueError, match="argument 'input'"):
        module(torch.tensor(1.0))
    assert module.calls == [] and not module.recorded()


def test_the_training_system_and_conversion_find_any_fp8_module():
    model = torch.nn.Sequential(ScaledIdentity(), torch.nn.Linear(16, 16))
    fp8mp.convert(model, recipe=CurrentScaling())
    assert model[0].fp8_recipe is None  # convert pins its recipe on what it converts only
    policy = FallbackPolicy()
    policy.step(model)
    assert set(policy.state_dict()) == {"0", "1"}
    assert set(Fp8Monitor(model).layers) == {"0", "1"}
    fp8mp.unconvert(model)
    assert type(model[0]) is torch.nn.Identity and type(model[1]) is torch.nn.Linear


@pytest.mark.parametrize("make, keys", [
    (lambda: fp8mp.nn.Linear(16, 16), ["weight", "bias"]),
    (lambda: fp8mp.nn.Conv1D(16, 16), ["weight", "bias"]),
    (lambda: fp8mp.nn.LayerNormLinear(16, 16), ["norm.weight", "norm.bias", "linear.weight", "linear.bias"]),
])
def test_state_dict_keys_are_the_torch_twins_plus_the_fp8_state(make, keys):
    prefix = "linear." if keys[0].startswith("norm.") else ""
    state = [f"{prefix}fp8_meta.{name}" for name in ("amax", "amax_history", "scale", "scale_inv", "initialized")]
    assert list(make().state_dict()) == keys + state


def test_fp8mp_nn_calls_no_private_method_of_another_object():
    """Modules use each other through their public methods (LayerNormLinear through its Linear's)."""
    package = pathlib.Path(fp8mp.nn.__file__).parent
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, owner = node.func.attr, node.func.value
            if not name.startswith("_") or name.startswith("__"):
                continue
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if ast.unparse(owner).startswith("torch."):  # torch's own private API, where it has no public one
                continue
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node.func)}")
    assert not found, found
