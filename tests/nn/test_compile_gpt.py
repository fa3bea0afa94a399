"""torch.compile(fullgraph=True) of a small GPT converted to fp8mp: no graph breaks, same losses as eager."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling

VOCAB, DIM, HEADS, SEQ, BATCH, STEPS = 64, 32, 2, 16, 2, 3


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = torch.nn.Linear(DIM, 4 * DIM), torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, DIM))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(SEQ, DIM)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.ln_f, self.lm_head = torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.lm_head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_gpt() -> TinyGPT:
    torch.manual_seed(0)
    # The LM head stays in high precision, as one usually keeps it.
    return fp8mp.convert(TinyGPT(), module_filter=lambda name, m: name != "lm_head")


def tokens(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    idx = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    return idx[:, :-1], idx[:, 1:]


def train(model, recipe, steps=STEPS) -> list[float]:
    """A few SGD steps; fp8_autocast is entered in eager around the (possibly compiled) model."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            loss = model(*tokens(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_gpt_is_converted():
    model = make_gpt()
    fp8_linears = [n for n, m in model.named_modules() if isinstance(m, fp8mp.nn.Linear)]
    assert len(fp8_linears) == 8 and type(model.lm_head) is torch.nn.Linear


@pytest.mark.parametrize("recipe", [DelayedScaling(amax_history_len=4), CurrentScaling()], ids=["delayed", "current"])
def test_gpt_compiles_fullgraph_and_matches_eager(recipe):
    eager = make_gpt()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    eager_losses = train(eager, recipe)
    compiled_losses = train(compiled, recipe)
    # Not bitwise: Inductor fuses LayerNorm, softmax, GELU and their backwards with other rounding than eager
    # (the FP8 ops themselves are bit-exact, see test_linear.py), so losses agree to 1e-6 relative, and the
    # scales, which come from amaxes of those tensors (gradients included), to 1e-5.
    torch.testing.assert_close(torch.tensor(compiled_losses), torch.tensor(eager_losses), rtol=1e-6, atol=0)
    for (name, m_e), m_c in zip(eager.named_modules(), compiled_model.modules()):
        if isinstance(m_e, fp8mp.nn.Linear):
            torch.testing.assert_close(m_c.fp8_meta.scale, m_e.fp8_meta.scale, rtol=1e-5, atol=0, msg=name)


def test_gpt_has_no_graph_breaks():
    model = make_gpt()
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling()):
        step0 = torch._dynamo.explain(model)(*tokens(0))  # runs the model: first step, current scaling
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling()):
        step1 = torch._dynamo.explain(model)(*tokens(1))  # later steps: the fused delayed-scaling update
    for explanation in (step0, step1):
        assert explanation.graph_break_count == 0, explanation.break_reasons
        assert explanation.graph_count == 1
