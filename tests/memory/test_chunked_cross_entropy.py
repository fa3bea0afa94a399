"""fp8mp.nn.chunked_linear_cross_entropy against an fp64 reference (loss and both gradients within the fp32 /
bf16 library path's own error), ignore_index and the two reductions, torch.autocast, the argument checks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp8mp.nn import chunked_linear_cross_entropy

TOKENS, HIDDEN, VOCAB = 70, 48, 300


def data(dtype, ignored=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, TOKENS // 2, HIDDEN, generator=gen).to(dtype)
    w = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.2).to(dtype)
    y = torch.randint(VOCAB, (2, TOKENS // 2), generator=gen)
    y.view(-1)[torch.randperm(TOKENS, generator=gen)[:ignored]] = -100
    return x, w, y


def loss_and_grads(fn, x, w, y, dtype=None):
    x = x.detach().to(dtype or x.dtype).requires_grad_()
    w = w.detach().to(dtype or w.dtype).requires_grad_()
    loss = fn(x, w, y)
    loss.backward()
    return loss.detach().double(), x.grad.double(), w.grad.double()


def reference(reduction):
    return lambda x, w, y: F.cross_entropy(F.linear(x, w).float().flatten(0, 1), y.flatten(), reduction=reduction)


def max_error(a, b):
    return max((u - v).abs().max().item() / v.abs().max().clamp_min(1e-30).item() for u, v in zip(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_tokens", [16, TOKENS])  # several chunks, and one
def test_loss_and_gradients_match_fp64_as_closely_as_the_unchunked_loss(dtype, reduction, chunk_tokens):
    x, w, y = data(dtype)
    exact = loss_and_grads(reference(reduction), x, w, y, torch.float64)
    library = loss_and_grads(reference(reduction), x, w, y)
    chunked = loss_and_grads(lambda a, b, c: chunked_linear_cross_entropy(a, b, c, reduction=reduction,
                                                                          chunk_tokens=chunk_tokens), x, w, y)
    eps = torch.finfo(dtype).eps
    # the chunked result is within a few roundings of fp64, as the library's unchunked path is
    assert max_error(chunked, exact) <= max(4 * max_error(library, exact), 8 * eps)
    assert max_error(chunked, exact) <= (1e-5 if dtype == torch.float32 else 2e-2)


def test_ignored_tokens_get_no_loss_and_no_gradient_and_mean_is_over_the_rest():
    x, w, y = data(torch.float64, ignored=30)
    loss, gx, _ = loss_and_grads(lambda a, b, c: chunked_linear_cross_entropy(a, b, c, chunk_tokens=9), x, w, y)
    keep = y != -100
    logp = torch.log_softmax(x @ w.t(), -1)
    manual = -logp[keep].gather(1, y[keep][:, None]).mean()  # the formula: mean over the tokens not ignored
    assert torch.allclose(loss, manual, rtol=1e-12)
    assert gx[~keep].abs().max() == 0 and gx[keep].abs().max() > 0
    everything_ignored = torch.full_like(y, -100)
    assert torch.isnan(chunked_linear_cross_entropy(x, w, everything_ignored))  # as F.cross_entropy


def test_under_autocast_the_head_runs_in_the_autocast_dtype_as_f_linear_would():
    x, w, y = data(torch.float32)
    x.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = chunked_linear_cross_entropy(x, w, y, chunk_tokens=32)
        library = F.cross_entropy(F.linear(x, w).float().flatten(0, 1), y.flatten())
    assert chunked.dtype == torch.float32
    assert (chunked - library).abs() <= 1e-5 * library.abs()


def test_bad_arguments_are_refused_by_name():
    x, w, y = data(torch.float32)
    for kwargs, message in ((dict(reduction="none"), "'reduction'"), (dict(chunk_tokens=0), "'chunk_tokens'")):
        with pytest.raises(ValueError, match=message):
            chunked_linear_cross_entropy(x, w, y, **kwargs)
    with pytest.raises(ValueError, match="'weight'"):
        chunked_linear_cross_entropy(x, w[:, :5], y)
    with pytest.raises(ValueError, match="'target'"):
        chunked_linear_cross_entropy(x, w, y[:1])
    with pytest.raises(TypeError, match="'weight'"):
        chunked_linear_cross_entropy(x, w.bfloat16(), y)
