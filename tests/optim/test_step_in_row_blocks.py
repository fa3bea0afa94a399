"""fp8mp.step_in_backward stepping large parameters a block of rows at a time (fp8mp/optim/row_block_grads.py):
an LM head under fp8mp.nn.chunked_linear_cross_entropy (its backward by vocabulary rows), FP8 Linear weights
(wgrad by output rows) and an embedding (sparse=True, or fp8mp.nn.embedding_grad_in_row_blocks: its gradient
made dense a block of rows at a time). Checked: the parameters and states equal those of optimizer.step() on the
gradient the blocks make up, bit for bit (AdamW and Lion, with and without a LossScaler), over steps with one
whose embedding gradient holds an Inf in one block only (nothing moves); the head's gradients against fp64 and
torch's unchunked loss, the embedding's against fp64 sums; a bit-exact resume; two models in two threads; the
gradient bytes held at once; the refusals."""
from __future__ import annotations

import copy
import io
import threading

import pytest
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.optim import row_block_grads

VOCAB, WIDTH, HIDDEN, STEPS, BAD_STEP = 100, 48, 64, 4, 2
BLOCK_BYTES = 8 * WIDTH * 2  # 8 rows of the head and the embedding (bf16): 13 blocks of 100 rows, the last 4 rows


class TinyLM(torch.nn.Module):
    """Sparse embedding, two FP8 Linear layers, an untied head under the chunked loss; `poison` makes the
    gradient of one token's embedding output Inf, so only the embedding rows' block holding that token's id is
    non-finite, after every other gradient came finite."""

    def __init__(self, embedding):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH, sparse=embedding == "sparse")
        if embedding == "rows":
            fp8mp.nn.embedding_grad_in_row_blocks(self.emb)
        self.fc1 = torch.nn.Linear(WIDTH, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.poison = False
        self.recipe = None  # fp8_autocast's (None: its default)

    def forward(self, ids):
        e = self.emb(ids)
        if self.poison:
            e.register_hook(lambda g: g.index_fill(1, torch.tensor([3]), float("inf")).index_fill(0, torch.tensor([1]), 0))
        with fp8mp.fp8_autocast(fp8_recipe=self.recipe):
            h = self.fc2(F.gelu(self.fc1(e))) + e
        return fp8mp.nn.chunked_linear_cross_entropy(h, self.head.weight, ids.roll(-1, 1), chunk_tokens=24)


def make(skip_nonfinite=True, embedding="sparse", optimizer_class=fp8mp.optim.AdamW, recipe=None):
    torch.manual_seed(0)
    model = fp8mp.convert(TinyLM(embedding), module_filter=lambda name, m: name != "head").to(torch.bfloat16)
    model.recipe = recipe
    return model, optimizer_class(model.parameters(), lr=1e-2, seed=3, skip_nonfinite=skip_nonfinite)


def batches():
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(VOCAB, (4, 16), generator=gen) for _ in range(STEPS)]


def snapshot(model, optimizer):
    return ([p.detach().clone() for p in model.parameters()],
            [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters()])


def assert_same_bits(a, b):
    (params_a, states_a), (params_b, states_b) = a, b
    for x, y in zip(params_a, params_b):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    assert len(states_a) == len(states_b)
    for sa, sb in zip(states_a, states_b):
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(sa[key].view(torch.uint8), sb[key].view(torch.uint8)), key


class Collect:
    """A RowBlockSink that keeps the blocks: the gradient a plain optimizer.step() is given."""

    def __init__(self):
        self.blocks = {}

    def block_rows(self, weight):
        return row_block_grads.rows_per_block(weight.shape, weight.element_size(), BLOCK_BYTES)

    def take_rows(self, weight, row_start, grad_rows):
        self.blocks.setdefault(weight, []).append((row_start, grad_rows.clone()))


def dense_embedding_grad(grad):
    """The sparse gradient's dense rows summed in fp64 and rounded once (the reference)."""
    dense = torch.zeros(grad.shape, dtype=torch.float64).index_add_(0, grad._indices()[0], grad._values().double())
    return dense.to(grad.dtype)


def large(model):
    return [p for p in model.parameters() if p.numel() * 2 > BLOCK_BYTES]


def train_plain(model, optimizer, steps, scaler=None):
    history = []
    for step, ids in steps:
        model.poison = step == BAD_STEP
        sink = Collect()
        with row_block_grads.handing_rows_to(sink, large(model)):
            loss = model(ids)
            (loss if scaler is None else scaler.scale(loss)).backward()
        for p, blocks in sink.blocks.items():
            assert p.grad is None and [start for start, _ in blocks] == list(range(0, p.shape[0], sink.block_rows(p)))
            p.grad = torch.cat([rows for _, rows in blocks])
        assert set(sink.blocks) - {model.emb.weight} == {model.head.weight, model.fc1.weight, model.fc2.weight}
        if model.emb.sparse:
            model.emb.weight.grad = dense_embedding_grad(model.emb.weight.grad)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()
        history.append(snapshot(model, optimizer))
    return history


def train_in_backward(model, optimizer, steps, stepper=None, scaler=None):
    stepper = stepper or fp8mp.step_in_backward(optimizer, scaler=scaler, max_grad_block_bytes=BLOCK_BYTES)
    history = []
    for step, ids in steps:
        model.poison = step == BAD_STEP
        assert stepper.backward(model(ids)) == (step != BAD_STEP)
        assert all(p.grad is None for p in model.parameters())
        if scaler is not None:
            scaler.update()
        history.append(snapshot(model, optimizer))
    return history


@pytest.mark.parametrize("with_scaler, embedding, optimizer_class, recipe", [
    (False, "sparse", fp8mp.optim.AdamW, None), (True, "sparse", fp8mp.optim.AdamW, None),
    (False, "rows", fp8mp.optim.AdamW, None), (False, "rows", fp8mp.optim.Lion, None),
    # the fine-grained recipes' FP8 Linears (fp8mp/scaling/block_quantizer.py): dy.T's rows, as quantized, a block at a time
    (False, "rows", fp8mp.optim.AdamW, fp8mp.recipe.RowwiseScaling()),
    (True, "rows", fp8mp.optim.AdamW, fp8mp.recipe.MXFP8Scaling()),
    (False, "sparse", fp8mp.optim.Lion, fp8mp.recipe.BlockScaling())], ids=str)
def test_row_blocks_step_the_bits_of_a_step_of_the_whole_gradient_and_an_inf_in_one_block_moves_nothing(
        with_scaler, embedding, optimizer_class, recipe):
    steps = list(enumerate(batches()))
    model_a, opt_a = make(skip_nonfinite=not with_scaler, embedding=embedding, optimizer_class=optimizer_class,
                          recipe=recipe)
    model_b = copy.deepcopy(model_a)
    opt_b = optimizer_class(model_b.parameters(), lr=1e-2, seed=3, skip_nonfinite=not with_scaler)
    scaler_a, scaler_b = ((fp8mp.LossScaler(init_scale=2.0**10) if with_scaler else None) for _ in range(2))
    plain = train_plain(model_a, opt_a, steps, scaler_a)
    in_backward = train_in_backward(model_b, opt_b, steps, scaler=scaler_b)
    if with_scaler:
        assert scaler_b.num_skipped_steps == 1 and scaler_b.get_scale() == scaler_a.get_scale() == 2.0**9
    for a, b in zip(plain, in_backward):
        assert_same_bits(a, b)
    assert_same_bits(in_backward[BAD_STEP - 1], in_backward[BAD_STEP])  # the poisoned step moved nothing
    assert int(opt_b.state[model_b.head.weight]["step"]) == STEPS - 1  # once a step, not once a block
    emb_before, emb_after = in_backward[0][0][0], in_backward[-1][0][0]
    seen = torch.cat([ids.flatten() for ids in batches()]).unique()
    unseen = torch.ones(VOCAB, dtype=torch.bool).index_fill_(0, seen, False)
    if optimizer_class is fp8mp.optim.AdamW:  # AdamW's moments and weight decay move rows no token touched
        assert unseen.any() and not torch.equal(emb_before[unseen], emb_after[unseen])


def test_resume_from_a_checkpoint_is_bit_exact():
    steps = [(step, ids) for step, ids in enumerate(batches()) if step != BAD_STEP]
    model, optimizer = make()
    reference = train_in_backward(model, optimizer, steps)
    model, optimizer = make()
    train_in_backward(model, optimizer, steps[:2])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model, optimizer = make()
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    assert_same_bits(reference[-1], train_in_backward(model, optimizer, steps[2:])[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_head_gradient_by_vocab_rows_against_fp64(dtype, reduction):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(40, WIDTH, generator=gen).to(dtype).requires_grad_()
    weight = torch.nn.Parameter(torch.randn(VOCAB, WIDTH, generator=gen).to(dtype))
    target = torch.randint(VOCAB, (40,), generator=gen)
    target[::7] = -100
    sink = Collect()
    with row_block_grads.handing_rows_to(sink, [weight]):
        fp8mp.nn.chunked_linear_cross_entropy(x, weight, target, reduction=reduction, chunk_tokens=16).backward()
    assert weight.grad is None
    grad_w = torch.cat([rows for _, rows in sink.blocks[weight]])
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    F.cross_entropy(F.linear(x64, w64), target, reduction=reduction).backward()
    # torch's unchunked loss in the inputs' dtype sets the rounding allowed: our error against fp64 is at most
    # twice its error, plus what recomputing the logits by vocabulary rows (another GEMM shape, other fp32
    # roundings than forward's, whose log-sum-exps it uses) may add: a few fp32 units of the largest logit
    x_t, w_t = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    F.cross_entropy(F.linear(x_t, w_t).float(), target, reduction=reduction).backward()
    logit_error = 4 * torch.finfo(torch.float32).eps * F.linear(x64, w64).abs().max()
    for ours, unchunked, exact in ((grad_w, w_t.grad, w64.grad), (x.grad, x_t.grad, x64.grad)):
        error, torch_error = ((g.double() - exact).abs().max() for g in (ours, unchunked))
        assert error <= 2 * torch_error + logit_error * exact.abs().max()
        assert error <= (2.0**-5 if dtype == torch.bfloat16 else 2.0**-16) * exact.abs().max()


@pytest.mark.parametrize("embedding", ["sparse", "rows"])
def test_gradient_bytes_held_at_once_shrink_to_a_block(embedding):
    model, optimizer = make(embedding=embedding)
    whole = fp8mp.step_in_backward(optimizer, max_grad_block_bytes=None)
    whole.backward(model(batches()[0]))
    whole.remove()
    blocks = fp8mp.step_in_backward(optimizer, max_grad_block_bytes=BLOCK_BYTES)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t.detach()):  # saved weights: other objects
        loss = model(batches()[0])
    blocks.backward(loss)
    if embedding == "sparse":
        sparse = 4 * 16 * (WIDTH * 2 + 8)  # the embedding's sparse gradient: a bf16 row and an int64 index a token
        assert whole.peak_grad_bytes == sparse + 2 * VOCAB * WIDTH  # the embedding's, made dense whole
        assert blocks.peak_grad_bytes == sparse + BLOCK_BYTES
    else:  # only a block of 768 bytes at a time (the biases' gradients are smaller)
        assert whole.peak_grad_bytes == 2 * VOCAB * WIDTH and blocks.peak_grad_bytes == BLOCK_BYTES


def test_embedding_rows_against_fp64_and_its_own_backward_without_a_stepper():
    emb = torch.nn.Embedding(VOCAB, WIDTH, padding_idx=4).to(torch.bfloat16)
    ids = torch.tensor([[4, 7, 7, 99, 0], [7, 8, 4, 99, 16]])
    grad_out = torch.randn(2, 5, WIDTH, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    F.embedding(ids, emb.weight, padding_idx=4).backward(grad_out)
    plain = emb.weight.grad
    emb.weight.grad = None
    fp8mp.nn.embedding_grad_in_row_blocks(emb)
    emb(ids).backward(grad_out)
    assert torch.equal(emb.weight.grad.view(torch.int16), plain.view(torch.int16))  # F.embedding's own backward
    emb.weight.grad, sink = None, Collect()
    with row_block_grads.handing_rows_to(sink, [emb.weight]):
        emb(ids).backward(grad_out)
    assert emb.weight.grad is None and len(sink.blocks[emb.weight]) == 13
    rows = torch.cat([block for _, block in sink.blocks[emb.weight]])
    keep = ids.flatten() != 4
    exact = torch.zeros(VOCAB, WIDTH, dtype=torch.float64).index_add_(
        0, ids.flatten()[keep], grad_out.reshape(-1, WIDTH)[keep].double())
    assert torch.equal(rows.view(torch.int16), exact.to(torch.bfloat16).view(torch.int16))  # one rounding of the sum
    assert not rows[4].any() and rows[7].any()
    fp8mp.nn.restore_embedding_grad(emb)
    assert "forward" not in vars(emb)
    with pytest.raises(ValueError, match="'embedding'"):
        fp8mp.nn.embedding_grad_in_row_blocks(torch.nn.Embedding(4, 4, sparse=True))


def test_refusals_name_what_is_wrong():
    model, optimizer = make()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="'max_grad_block_bytes'"):
            fp8mp.step_in_backward(optimizer, max_grad_block_bytes=bad)
    stepper = fp8mp.step_in_backward(optimizer, max_grad_block_bytes=BLOCK_BYTES)
    with pytest.raises(RuntimeError, match="another optimizer"):
        with row_block_grads.handing_rows_to(Collect(), [model.head.weight]):
            stepper.backward(model(batches()[0]))
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    model.head.weight = model.emb.weight  # tied: rows from the head, a whole gradient from the embedding
    with pytest.raises(RuntimeError, match="both in row blocks and as a whole"):
        stepper.backward(model(batches()[0]))
    assert all(torch.equal(a, p) for a, p in zip(before, params)) and not optimizer.state  # refused while checking


def test_two_models_in_two_threads_step_their_own_rows():
    """The registry is keyed by parameter: two steppers whose backwards run at once in two threads each take
    their own model's rows (the bits of each trained alone)."""
    steps = [(step, ids) for step, ids in enumerate(batches()) if step != BAD_STEP][:2]
    model, optimizer = make()
    alone = train_in_backward(model, optimizer, steps)[-1]
    made, results = [make() for _ in range(2)], {}  # built first: make() seeds torch's global generator

    def train(key):
        results[key] = train_in_backward(*made[key], steps)[-1]

    threads = [threading.Thread(target=train, args=(key,)) for key in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for key in range(2):
        assert_same_bits(alone, results[key])
