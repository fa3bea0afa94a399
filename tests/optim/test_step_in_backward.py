"""fp8mp.step_in_backward against optimizer.step() after backward: the same bits of every parameter and state over
several steps (fp8mp.optim.AdamW and Lion, FP8 states, bf16 parameters, FP8 Linear layers, a tied embedding, with
and without a LossScaler), a step whose gradient turns Inf half-way through backward leaving every parameter and
state as it was, a bit-exact resume from a checkpoint, the gradient bytes held at once, and the refusals."""
from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F

import fp8mp

VOCAB, WIDTH, STEPS, BAD_STEP = 40, 32, 4, 2


class TinyLM(torch.nn.Module):
    """Embedding, two FP8 Linear layers and a head tied to the embedding; `poison` makes the gradient that flows
    back into the first layer's output Inf, after the head and the second layer got finite gradients."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.fc1 = torch.nn.Linear(WIDTH, 64)
        self.fc2 = torch.nn.Linear(64, WIDTH)
        self.poison = False

    def forward(self, ids):
        h = F.gelu(self.fc1(self.emb(ids)))
        if self.poison:
            h.register_hook(lambda g: g * float("inf"))
        return F.linear(self.fc2(h), self.emb.weight)


def make(optimizer_class, skip_nonfinite=True):
    torch.manual_seed(0)
    model = fp8mp.convert(TinyLM()).to(torch.bfloat16)
    return model, optimizer_class(model.parameters(), lr=1e-2, skip_nonfinite=skip_nonfinite, seed=3)


def batches():
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(VOCAB, (4, 16), generator=gen) for _ in range(STEPS)]


def loss_of(model, ids, step):
    model.poison = step == BAD_STEP
    with fp8mp.fp8_autocast():
        logits = model(ids)
    return F.cross_entropy(logits.float().flatten(0, 1), ids.roll(-1, 1).flatten())


def snapshot(model, optimizer):
    return ([p.detach().clone() for p in model.parameters()],
            [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters()])  # by parameter


def assert_same_bits(a, b):
    (params_a, states_a), (params_b, states_b) = a, b
    assert all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(params_a, params_b))
    assert len(states_a) == len(states_b)
    for sa, sb in zip(states_a, states_b):
        assert sa.keys() == sb.keys()
        for key in sa:
            x, y = sa[key], sb[key]
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), key


def train_plain(model, optimizer, scaler, steps):
    history = []
    for step, ids in steps:
        loss = loss_of(model, ids, step)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()
        history.append(snapshot(model, optimizer))
    return history


def train_in_backward(model, optimizer, scaler, steps, stepper=None):
    stepper = stepper or fp8mp.step_in_backward(optimizer, scaler=scaler)
    history = []
    for step, ids in steps:
        stepped = stepper.backward(loss_of(model, ids, step))
        assert stepped == (step != BAD_STEP)
        assert all(p.grad is None for p in model.parameters())
        if scaler is not None:
            scaler.update()
        history.append(snapshot(model, optimizer))
    return history


@pytest.mark.parametrize("optimizer_class", [fp8mp.optim.AdamW, fp8mp.optim.Lion])
@pytest.mark.parametrize("with_scaler", [False, True])
def test_same_bits_as_a_step_after_backward_and_a_bad_step_changes_nothing(optimizer_class, with_scaler):
    steps = list(enumerate(batches()))
    model_a, opt_a = make(optimizer_class, skip_nonfinite=not with_scaler)
    model_b, opt_b = copy.deepcopy(model_a), None
    opt_b = optimizer_class(model_b.parameters(), lr=1e-2, skip_nonfinite=not with_scaler, seed=3)
    scaler_a = fp8mp.LossScaler(init_scale=2.0**10) if with_scaler else None
    scaler_b = fp8mp.LossScaler(init_scale=2.0**10) if with_scaler else None
    plain = train_plain(model_a, opt_a, scaler_a, steps)
    in_backward = train_in_backward(model_b, opt_b, scaler_b, steps)
    for a, b in zip(plain, in_backward):
        assert_same_bits(a, b)
    assert_same_bits(in_backward[BAD_STEP - 1], in_backward[BAD_STEP])  # the poisoned step moved nothing
    assert not torch.equal(in_backward[BAD_STEP][0][0], in_backward[-1][0][0])  # the others did
    if with_scaler:
        assert scaler_b.num_skipped_steps == 1 and scaler_b.get_scale() == scaler_a.get_scale() == 2.0**9


def test_resume_from_a_checkpoint_is_bit_exact():
    steps = [(step, ids) for step, ids in enumerate(batches()) if step != BAD_STEP]
    model, optimizer = make(fp8mp.optim.AdamW)
    reference = train_in_backward(model, optimizer, None, steps)
    model, optimizer = make(fp8mp.optim.AdamW)
    train_in_backward(model, optimizer, None, steps[:2])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model, optimizer = make(fp8mp.optim.AdamW)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    resumed = train_in_backward(model, optimizer, None, steps[2:])
    assert_same_bits(reference[-1], resumed[-1])


def test_unverified_single_pass_with_nothing_to_skip_matches_a_plain_step():
    steps = [(step, ids) for step, ids in enumerate(batches()) if step != BAD_STEP]
    model_a, opt_a = make(fp8mp.optim.AdamW, skip_nonfinite=False)
    model_b, opt_b = make(fp8mp.optim.AdamW, skip_nonfinite=False)
    stepper = fp8mp.step_in_backward(opt_b, verify=False)
    assert not stepper.verify
    for a, b in zip(train_plain(model_a, opt_a, None, steps), train_in_backward(model_b, opt_b, None, steps, stepper)):
        assert_same_bits(a, b)


def test_gradient_bytes_held_at_once_are_the_largest_gradient_not_all_of_them():
    model, optimizer = make(fp8mp.optim.AdamW)
    stepper = fp8mp.step_in_backward(optimizer)
    stepper.backward(loss_of(model, batches()[0], 0))
    sizes = [2 * p.numel() for p in model.parameters()]  # bf16 gradients
    assert stepper.peak_grad_bytes == max(sizes) < sum(sizes)


def test_refusals_name_what_is_wrong():
    model, optimizer = make(fp8mp.optim.AdamW)
    with pytest.raises(TypeError, match="'optimizer'"):
        fp8mp.step_in_backward(torch.optim.AdamW(model.parameters()))
    with pytest.raises(ValueError, match="'verify'"):
        fp8mp.step_in_backward(optimizer, verify=False)
    stepper = fp8mp.optim.step_in_backward(optimizer)
    with pytest.raises(RuntimeError, match="global gradient norm"):
        stepper.clip_grad_norm_(1.0)
    with pytest.raises(RuntimeError, match="outside StepInBackward.backward"):
        loss_of(model, batches()[0], 0).backward()
    stepper.remove()
    loss_of(model, batches()[0], 0).backward()  # hooks off: gradients accumulate in .grad
    stepper = fp8mp.step_in_backward(optimizer)
    with pytest.raises(RuntimeError, match="gradient accumulation"):
        stepper.backward(loss_of(model, batches()[0], 0))
