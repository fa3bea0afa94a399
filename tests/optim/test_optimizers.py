"""fp8mp.optim.AdamW and Lion as torch optimizers: bit-exact resume through torch.save / torch.load(weights_only=True),
torch.optim.AdamW's trajectory with fp32 states under an LR scheduler and gradient clipping, skipped non-finite
steps, and errors that name the argument."""
from __future__ import annotations

import io

import pytest
import torch

import fp8mp
from fp8mp.optim import AdamW, Lion

STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn)


def tiny_model(dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(48, 200), torch.nn.GELU(), torch.nn.Linear(200, 8))
    return model.to(dtype)


def train(model, optimizer, steps, first_batch=0, scheduler=None):
    for i in range(first_batch, first_batch + steps):
        gen = torch.Generator().manual_seed(i)
        x = torch.randn(16, 48, generator=gen).to(next(model.parameters()).dtype)
        y = torch.randn(16, 8, generator=gen).to(x.dtype)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x).float(), y.float()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def make(kind, params, state_dtype):
    if kind == "adamw":
        return AdamW(params, lr=3e-3, weight_decay=0.1, state_dtype=state_dtype, seed=42)
    return Lion(params, lr=3e-4, weight_decay=0.1, state_dtype=state_dtype, seed=42)


@pytest.mark.parametrize("kind", ["adamw", "lion"])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
def test_resume_is_bit_exact(kind, state_dtype, param_dtype):
    straight = tiny_model(param_dtype)
    opt = make(kind, straight.parameters(), state_dtype)
    train(straight, opt, 7)
    train(straight, opt, 5, first_batch=7)

    first = tiny_model(param_dtype)
    opt_first = make(kind, first.parameters(), state_dtype)
    train(first, opt_first, 7)
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": opt_first.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    resumed = tiny_model(param_dtype, seed=1)  # other initial weights: everything must come from the checkpoint
    resumed.load_state_dict(checkpoint["model"])
    opt_resumed = make(kind, resumed.parameters(), state_dtype)
    opt_resumed.seed = 999  # the per-parameter seeds are in the checkpoint, not taken from the new optimizer
    opt_resumed.load_state_dict(checkpoint["optimizer"])
    train(resumed, opt_resumed, 5, first_batch=7)

    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(bits(a), bits(b))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        sa, sb = opt.state[a], opt_resumed.state[b]
        assert sa.keys() == sb.keys()
        for key in sa:
            assert sa[key].dtype == sb[key].dtype and sa[key].device == sb[key].device, key
            assert torch.equal(bits(sa[key]), bits(sb[key])), key
    assert int(opt.state[next(straight.parameters())]["step"]) == 12


def test_state_holds_tensors_only_and_its_bytes():
    model = tiny_model()
    opt = AdamW(model.parameters())
    train(model, opt, 1)
    numel = sum(p.numel() for p in model.parameters())
    for state in opt.state.values():
        assert all(isinstance(v, torch.Tensor) for v in state.values())
        assert state["exp_avg"].dtype == torch.float8_e4m3fn and state["exp_avg_sq"].dtype == torch.float8_e4m3fn
    # 2 bytes of codes + 2 fp32 scales per 128 elements (+ the counters), against fp32 AdamW's 8.
    assert opt.state_bytes() / numel < 2.0 + 8 / 128 + 0.01


def test_fp32_states_follow_torch_adamw_with_scheduler_and_clipping():
    ours, theirs = tiny_model(torch.float32), tiny_model(torch.float32)
    opt = AdamW(ours.parameters(), lr=1e-2, weight_decay=0.05, state_dtype=torch.float32)
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.05, foreach=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.3)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=3, gamma=0.3)
    initial = [p.detach().clone() for p in ours.parameters()]
    train(ours, opt, 10, scheduler=sched)
    train(theirs, ref, 10, scheduler=ref_sched)
    assert opt.param_groups[0]["lr"] == ref.param_groups[0]["lr"] < 1e-2
    for a, b, p0 in zip(ours.parameters(), theirs.parameters(), initial):
        moved = (b - p0).abs().max()
        # Both are fp32 AdamW on the same batches; what differs is the order of fp32 roundings (and what that
        # does to the model's gradients downstream): far below the distance training moved the weights.
        assert (a - b).abs().max() <= 1e-4 * moved + 1e-6


def test_without_a_scheduler_a_changed_lr_is_read_each_step():
    model = tiny_model(torch.float32)
    opt = AdamW(model.parameters(), state_dtype=torch.float32)
    train(model, opt, 1)
    before = [p.detach().clone() for p in model.parameters()]
    for group in opt.param_groups:
        group["lr"] = 0.0
        group["weight_decay"] = 0.0
    train(model, opt, 1, first_batch=1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("kind", ["adamw", "lion"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_step_with_a_nonfinite_gradient_changes_nothing(kind, bad):
    model = tiny_model()
    opt = make(kind, model.parameters(), torch.float8_e4m3fn)
    train(model, opt, 2)
    params = list(model.parameters())
    snapshot = [bits(p).clone() for p in params] + [bits(v).clone() for p in params for v in opt.state[p].values()]
    for p in params:
        p.grad = torch.randn_like(p)
    params[-1].grad[0] = bad  # one element of one parameter: the whole step is skipped
    opt.step()
    after = [bits(p) for p in params] + [bits(v) for p in params for v in opt.state[p].values()]
    assert all(torch.equal(a, b) for a, b in zip(after, snapshot))
    params[-1].grad[0] = 0.0
    opt.step()
    assert int(opt.state[params[0]]["step"]) == 3


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="argument 'state_dtype' must be one of .* got torch.float16"):
        AdamW([torch.nn.Parameter(torch.zeros(3))], state_dtype=torch.float16)
    with pytest.raises(ValueError, match="argument 'state_dtype'"):
        Lion([torch.nn.Parameter(torch.zeros(3))], state_dtype=torch.float8_e5m2)
    with pytest.raises(TypeError, match="argument 'params' holds a torch.int64 parameter"):
        AdamW([torch.zeros(3, dtype=torch.int64)])
    with pytest.raises(TypeError, match="argument 'params' holds a torch.float16 parameter"):
        AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))])
    with pytest.raises(ValueError, match=r"argument 'params' holds parameters on mixed devices \(cpu, meta\)"):
        AdamW([torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, device="meta"))])
    opt = AdamW([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="mixed devices"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, device="meta"))]})
    with pytest.raises(ValueError, match="argument 'betas\\[1\\]' is out of range"):
        AdamW([torch.nn.Parameter(torch.zeros(3))], betas=(0.9, 1.0))

    embedding = torch.nn.Embedding(10, 4, sparse=True)
    opt = AdamW(embedding.parameters())
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradient"):
        opt.step()


def test_a_state_dict_of_another_state_dtype_is_refused():
    model = tiny_model()
    opt = AdamW(model.parameters(), state_dtype=torch.bfloat16)
    train(model, opt, 1)
    other = AdamW(model.parameters(), state_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="holds the states of parameter 0 in torch.bfloat16, this optimizer's "
                                         "state_dtype for it is torch.float8_e4m3fn"):
        other.load_state_dict(opt.state_dict())


def test_fp8_states_cast_into_another_dtype_are_refused_by_their_group():
    """torch.distributed.checkpoint's load copies the stored tensors into the target optimizer's, so E4M3 states
    loaded into a bf16-state optimizer arrive as bf16 tensors (codes without their scales): the saved param
    group's 'state_dtype' still says what they were, and load_state_dict refuses them, naming the parameter."""
    model = tiny_model()
    opt = AdamW(model.parameters(), state_dtype=torch.float8_e4m3fn)
    train(model, opt, 1)
    saved = opt.state_dict()
    assert [group["state_dtype"] for group in saved["param_groups"]] == [torch.float8_e4m3fn]
    for values in saved["state"].values():  # what such a load leaves: the target's dtype, no scales
        for name in ("exp_avg", "exp_avg_sq"):
            values[name] = values[name].float().bfloat16()
        del values["exp_avg_scale"], values["exp_avg_sq_scale"]
    other = AdamW(model.parameters(), state_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="holds the states of parameter 0 in torch.float8_e4m3fn, this optimizer's "
                                         "state_dtype for it is torch.bfloat16"):
        other.load_state_dict(saved)


def test_a_param_group_may_set_its_own_state_dtype():
    """Weights in E4M3, biases in bf16 (a group's 'state_dtype'): each group's states are its own, and the
    optimizer steps them as two optimizers of those state dtypes would, bit for bit; the state_dict round trip
    keeps them."""
    model, reference = tiny_model(), tiny_model()
    weights = [p for p in model.parameters() if p.dim() == 2]
    biases = [p for p in model.parameters() if p.dim() == 1]
    opt = AdamW([{"params": weights}, {"params": biases, "state_dtype": torch.bfloat16}], lr=3e-3, seed=42)
    ref_weights = AdamW([p for p in reference.parameters() if p.dim() == 2], lr=3e-3, seed=42)
    ref_biases = AdamW([p for p in reference.parameters() if p.dim() == 1], lr=3e-3, seed=42 + len(weights),
                       state_dtype=torch.bfloat16)
    train(model, opt, 3)
    for i in range(3):  # the same batches, one optimizer per state dtype
        gen = torch.Generator().manual_seed(i)
        x, y = torch.randn(16, 48, generator=gen).bfloat16(), torch.randn(16, 8, generator=gen).bfloat16()
        for o in (ref_weights, ref_biases):
            o.zero_grad()
        torch.nn.functional.mse_loss(reference(x).float(), y.float()).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        ref_weights.step()
        ref_biases.step()
    assert {opt.state[p]["exp_avg"].dtype for p in biases} == {torch.bfloat16}
    assert {opt.state[p]["exp_avg"].dtype for p in weights} == {torch.float8_e4m3fn}
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(bits(p), bits(q))
    restored = AdamW([{"params": weights}, {"params": biases, "state_dtype": torch.bfloat16}], lr=3e-3, seed=42)
    restored.load_state_dict(opt.state_dict())
    for p in model.parameters():
        assert all(torch.equal(bits(opt.state[p][k]), bits(v)) for k, v in restored.state[p].items())
    with pytest.raises(ValueError, match="a param group's 'state_dtype' must be one of"):
        AdamW([{"params": biases, "state_dtype": torch.float16}])


def test_loss_scaler_steps_it_and_skips_overflow():
    model = tiny_model(torch.float32)
    opt = AdamW(model.parameters())
    scaler = fp8mp.LossScaler(init_scale=2.0 ** 10)
    x = torch.randn(4, 48)
    loss = model(x).square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert int(opt.state[next(model.parameters())]["step"]) == 1


def test_lion_trains_a_tiny_regression():
    torch.manual_seed(0)
    w_true = torch.randn(8, 48)
    model = torch.nn.Linear(48, 8, bias=False).bfloat16()
    opt = Lion(model.parameters(), lr=1e-2)
    x = torch.randn(256, 48)
    first = None
    for _ in range(300):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.bfloat16()).float(), x @ w_true.T)
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 0.1 * first


@pytest.mark.filterwarnings("ignore::UserWarning")  # DCP without a process group says it runs in one process
def test_distributed_checkpoint_round_trip_is_bit_exact(tmp_path):
    import torch.distributed.checkpoint as dcp

    model = tiny_model()
    opt = AdamW(model.parameters(), seed=3)
    train(model, opt, 3)
    dcp.save({"optimizer": opt.state_dict()}, checkpoint_id=str(tmp_path))
    template = {"optimizer": opt.state_dict()}
    template["optimizer"]["state"] = {i: {k: torch.zeros_like(v) for k, v in s.items()}
                                      for i, s in template["optimizer"]["state"].items()}
    dcp.load(template, checkpoint_id=str(tmp_path))
    fresh = tiny_model(seed=1)
    fresh.load_state_dict(model.state_dict())
    opt_fresh = AdamW(fresh.parameters())
    opt_fresh.load_state_dict(template["optimizer"])
    for a, b in zip(model.parameters(), fresh.parameters()):
        for key, value in opt.state[a].items():
            assert torch.equal(bits(value), bits(opt_fresh.state[b][key])), key
