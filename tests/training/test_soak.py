"""Soak: a few thousand Trainer steps of a small FP8 model with injected faults, against the same run without.

Faults, each on its own steps:
    NaN batch            the whole input NaN                           -> skipped (non-finite gradients)
    Inf activation       one Inf in the input of the FP8 head, which    -> skipped (the FP8 cast check: the
                         E4M3 saturates (finite loss and gradients)        gradients alone look fine)
    gradient overflow    the loss scale times 2^120 for one step: the   -> skipped, the scale backs off and
                         scaled backward overflows fp32                    grows back
    loss spike x1e4      targets 100x off for one step                 -> NOT skipped: a finite spike (E5M2
                                                                           saturates it, clipping bounds the
                                                                           update) is trained through
    growing layer        fc2's input grows 2x per step (from 2^120)    -> its overflowing steps are skipped;
                         until it overflows and its layer falls back;      FallbackPolicy sends it to high
                         then it calms (x1 again)                          precision, then back to FP8
Checked after every step: no weight or optimizer state is non-finite, and a step was skipped exactly
when it carried a non-finite fault. At the end the faulty run's held-out loss is within 1% of the clean one.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fp8mp

STEPS, BATCH, NOISE = 2400, 64, 0.3
NAN_BATCH = {300, 900, 1500}
INF_ACTIVATION = {400, 1000, 1600}
GRADIENT_OVERFLOW = {600, 1200, 1800}
LOSS_SPIKE = {700, 1300}
GROW_FROM = 2000  # fc2's input is multiplied by 2^(120 + k) at step GROW_FROM + k, until its layer falls back
COOLDOWN = 100


class Grown(torch.nn.Module):
    """fc(x * gain) / gain: the same function at any gain in exact arithmetic, activations `gain` times larger."""

    def __init__(self, fc: torch.nn.Module):
        super().__init__()
        self.fc, self.gain, self.overflowed = fc, 1.0, False

    def forward(self, x):
        grown = x * self.gain
        self.overflowed = not bool(grown.isfinite().all())  # the harness's record of what it injected
        return self.fc(grown) / self.gain


def teacher(gen: torch.Generator):
    w1, w2 = torch.randn(64, 32, generator=gen) / 32 ** 0.5, torch.randn(16, 64, generator=gen) / 8
    return lambda x: torch.tanh(x @ w1.T) @ w2.T


def data(seed: int, count: int):
    gen = torch.Generator().manual_seed(seed)
    f = teacher(torch.Generator().manual_seed(1))
    xs = [torch.randn(BATCH, 32, generator=gen) for _ in range(count)]
    return [(x, f(x) + NOISE * torch.randn(BATCH, 16, generator=gen)) for x in xs]


def make_trainer() -> fp8mp.Trainer:
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(32, 64))
    model.add_module("act1", torch.nn.GELU())
    model.add_module("fc2", torch.nn.Linear(64, 64))
    model.add_module("act2", torch.nn.GELU())
    model.add_module("head", torch.nn.Linear(64, 16))
    trainer = fp8mp.Trainer(model, {"lr": 1e-3, "activation_dtype": "fp32", "growth_interval": 100,
                                    "fallback_cooldown_steps": COOLDOWN, "amax_history_len": 16, "progress_bar": False})
    trainer.model.fc2 = Grown(trainer.model.fc2)
    return trainer


def all_finite(trainer) -> bool:
    tensors = [*trainer.model.parameters()]
    tensors += [v for state in trainer.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return all(bool(t.isfinite().all()) for t in tensors)


def run(faults: bool):
    trainer = make_trainer()
    model, train = trainer.model, data(0, STEPS)
    inf_hook = {"on": False}
    model.head.register_forward_pre_hook(lambda m, args: (args[0].index_fill(1, torch.tensor([3]), math.inf),)
                                         if inf_hook["on"] else None)
    skipped, nonfinite_faults, fallback_seen, scales = [], [], [], []
    growing = None
    for step, (x, y) in enumerate(train):
        scale_factor = 1.0
        inf_hook["on"] = faults and step in INF_ACTIVATION
        if faults:
            x = torch.full_like(x, math.nan) if step in NAN_BATCH else x
            y = y + 100 * (y - y.mean()) if step in LOSS_SPIKE else y
            scale_factor = 2.0 ** 120 if step in GRADIENT_OVERFLOW else 1.0
            if step == GROW_FROM:
                growing = 2.0 ** 120
            if growing is not None and model.fc2.fc.fp8_fallback:
                growing = None  # it fell back: calm
            model.fc2.gain = growing if growing is not None else 1.0
            if growing is not None:
                growing *= 2
        before = trainer.scaler.num_skipped_steps
        trainer.train_step((x, y), lambda m, b: F.mse_loss(m(b[0]), b[1]) * scale_factor)
        nonfinite = faults and step in NAN_BATCH or inf_hook["on"] or scale_factor > 1 or model.fc2.overflowed
        skipped.append(trainer.scaler.num_skipped_steps > before)
        nonfinite_faults.append(nonfinite)
        fallback_seen.append(model.fc2.fc.fp8_fallback)
        scales.append(trainer.scaler.get_scale())
        assert all_finite(trainer), f"non-finite weights or optimizer state after step {step}"
    model.fc2.gain = 1.0
    held_out = trainer.evaluate(data(1, 20), lambda m, b: F.mse_loss(m(b[0]), b[1]))
    return {"skipped": skipped, "faults": nonfinite_faults, "fallback": fallback_seen, "scales": scales,
            "held_out": held_out, "trainer": trainer}


@pytest.mark.slow  # two runs of 2400 steps: about a minute on 2 cores
def test_soak_with_injected_faults():
    clean, faulty = run(faults=False), run(faults=True)
    assert not any(clean["skipped"])
    skipped = [step for step, s in enumerate(faulty["skipped"]) if s]
    injected = [step for step, f in enumerate(faulty["faults"]) if f]
    print(f"skipped steps {skipped}\ninjected non-finite faults {injected}")
    assert skipped == injected  # every skip is an injected fault, every non-finite fault is skipped
    assert set(NAN_BATCH | INF_ACTIVATION | GRADIENT_OVERFLOW) <= set(skipped)
    assert not set(LOSS_SPIKE) & set(skipped)
    grow_overflows = [s for s in skipped if s >= GROW_FROM]
    assert len(grow_overflows) >= 2  # the growing layer overflowed until FallbackPolicy took it out of FP8
    # It fell back, stayed in high precision for its cooldown, and came back to FP8 once calm.
    fell_back = faulty["fallback"].index(True)
    assert fell_back == grow_overflows[-1]
    assert all(faulty["fallback"][fell_back: fell_back + COOLDOWN]) and not faulty["fallback"][-1]
    # The scale backs off at each overflow and grows back (growth_interval 100): after the last fault
    # it climbs above where it was when the faults began.
    scales = faulty["scales"]
    assert min(scales) < scales[min(skipped) - 1] < scales[-1]
    gap = faulty["held_out"] / clean["held_out"] - 1
    print(f"held-out loss: clean {clean['held_out']:.5f}, with faults {faulty['held_out']:.5f} ({gap:+.3%})")
    assert abs(gap) < 0.01
