"""fp8mp.nn.GroupedLinear under the fine-grained recipes (RowwiseScaling, BlockScaling, MXFP8Scaling): each group
bit for bit fp8mp.nn.Linear's block path on that group alone, forward and backward, and within the fp32
accumulation bound of a float64 reference of each group's quantize-dequantize math (blockwise_reference's
DeepSeek-V3 tiles, torchao's MX quantization); groups that are empty, hold every token, or are not multiples of the
blocks; bad arguments named."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fp8mp
import torchao_reference
from blockwise_reference import deepseek_quantize
from fp8mp.nn import GroupedLinear
from fp8mp.recipe import BlockScaling, Format, MXFP8Scaling, RowwiseScaling
from fp8mp.scaling.recipe_registry import quantizer_for

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

RECIPES = [RowwiseScaling(), RowwiseScaling(power_of_2_scales=False), BlockScaling(),
           BlockScaling(power_of_2_scales=True, fp8_format=Format.HYBRID), MXFP8Scaling(),
           MXFP8Scaling(scale_mode="floor", fp8_format=Format.HYBRID)]
RECIPE_IDS = ["rowwise", "rowwise-fp32", "block", "block-pow2-hybrid", "mxfp8", "mxfp8-floor-hybrid"]


def routed_counts(tokens: int, experts: int, top_k: int, seed: int) -> list[int]:
    """Tokens per expert of a random top-k routing (each token picks top_k distinct experts)."""
    gen = torch.Generator().manual_seed(seed)
    picks = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices.flatten()
    return torch.bincount(picks, minlength=experts).tolist()


# Empty groups, one group holding every token, sizes that are not multiples of 32 or 128 (and one above 128),
# top-k 1 and 8, E up to 256.
GROUPINGS = {
    "empty_and_partial_blocks": [5, 0, 130, 1, 0, 33],
    "one_group_all": [0, 0, 150, 0],
    "top1_e8": routed_counts(64, 8, 1, seed=1),
    "top8_e64": routed_counts(24, 64, 8, seed=2),
    "top8_e256": routed_counts(40, 256, 8, seed=3),
}


def groups(sizes):
    start = 0
    for g, size in enumerate(sizes):
        yield g, slice(start, start + size)
        start += size


def make(sizes, in_f=160, out_f=48, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    module = GroupedLinear(len(sizes), in_f, out_f, bias=True).to(dtype)
    with torch.no_grad():
        module.bias.mul_(4)
    x = (torch.randn(sum(sizes), in_f) * 3).to(dtype).requires_grad_()
    return module, x


def run(module, x, sizes, recipe, grad_seed=7):
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        y = module(x, sizes)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed)).to(y.dtype)
    y.backward(dy)
    return y.detach(), dy


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


@pytest.mark.parametrize("grouping", list(GROUPINGS))
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_each_group_is_linear_block_path_on_that_group_bit_for_bit(recipe, grouping):
    sizes = GROUPINGS[grouping]
    dtype = torch.bfloat16 if grouping.startswith("top8") else torch.float32
    module, x = make(sizes, dtype=dtype)
    y, dy = run(module, x, sizes, recipe)
    for g, rows in groups(sizes):
        linear = fp8mp.nn.Linear(module.in_features, module.out_features).to(dtype)
        with torch.no_grad():
            linear.weight.copy_(module.weight[g])
            linear.bias.copy_(module.bias[g])
        xg = x.detach()[rows].clone().requires_grad_()
        if xg.shape[0] == 0:  # an empty group: no rows, and nothing added to its weight's or bias's gradient
            assert not module.weight.grad[g].any() and not module.bias.grad[g].any()
            continue
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            yg = linear(xg)
        yg.backward(dy[rows])
        assert torch.equal(bits(y[rows]), bits(yg.detach())), f"group {g}: output"
        assert torch.equal(bits(x.grad[rows]), bits(xg.grad)), f"group {g}: input gradient"
        assert torch.equal(bits(module.weight.grad[g]), bits(linear.weight.grad)), f"group {g}: weight gradient"
        # The bias gradient is a sum over the group's rows in fp32 (segment_reduce's order, not Linear's
        # sum(0)'s): equal up to fp32 summation order, then one rounding to the parameters' dtype.
        abs_sum = dy[rows].float().abs().sum(0)
        unit = 2.0 ** -8 if dtype == torch.bfloat16 else 0.0
        bound = xg.shape[0] * 2.0 ** -24 * abs_sum + unit * linear.bias.grad.float().abs()
        assert ((module.bias.grad[g].float() - linear.bias.grad.float()).abs() <= bound).all(), f"group {g}: bias"


# ----------------------------------------------------------------------------- float64 reference
def dequantized(t: torch.Tensor, block_rows: int, block_cols: int, recipe, fmt: str) -> torch.Tensor:
    """float64 values of t after the recipe's quantization in block_rows x block_cols tiles, independently:
    DeepSeek-V3's tiles (blockwise_reference) for rowwise and block scaling, torchao's to_mx for MXFP8."""
    dtype = FP8[fmt]
    if isinstance(recipe, MXFP8Scaling):
        cols = t.shape[1]
        padded = F.pad(t.float(), (0, -cols % 32))  # a partial block holds its own elements (zeros elsewhere)
        scale, data = torchao_reference.to_mx(padded, dtype, 32, recipe.scale_mode)
        values = data.double().reshape(t.shape[0], -1, 32) * scale.double().reshape(t.shape[0], -1, 1)
        return values.reshape(t.shape[0], -1)[:, :cols]
    data, scale_inv = deepseek_quantize(t, block_rows, block_cols, dtype, recipe.power_of_2_scales)
    expand = scale_inv.double().repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return data.double() * expand[: t.shape[0], : t.shape[1]]


# The recipes' block geometry from their definitions (torchao's rowwise, DeepSeek-V3, OCP MX v1.0), not from
# fp8mp's quantizers: (block length along K, None for the whole K; weight block rows).
GEOMETRY = {RowwiseScaling: (None, 1), BlockScaling: (128, 128), MXFP8Scaling: (32, 1)}


def block_of(recipe, length: int) -> int:
    block_k = GEOMETRY[type(recipe)][0]
    return length if block_k is None else block_k


def assert_within_fp32_accumulation(got, a64, b64, bias=None):
    """got vs a64 @ b64.T (+ bias) in float64: fp32 chunk sums, scale products and accumulation over K,
    (K + 4) 2^-24 of the sum of |products|."""
    want = a64 @ b64.T + (bias.double() if bias is not None else 0)
    bound = (a64.shape[1] + 4) * 2.0 ** -24 * (a64.abs() @ b64.abs().T) + 1e-30
    err = (got.double() - want).abs()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item()}"


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_forward_and_backward_within_the_bound_of_a_float64_reference_per_group(recipe):
    sizes = GROUPINGS["empty_and_partial_blocks"]
    module, x = make(sizes)
    y, dy = run(module, x, sizes, recipe)
    fwd, bwd = recipe.fp8_format.forward_format, recipe.fp8_format.backward_format
    K, N, wbr = module.in_features, module.out_features, GEOMETRY[type(recipe)][1]
    for g, rows in groups(sizes):
        xg, wg, dyg = x.detach()[rows], module.weight.detach()[g], dy[rows]
        if xg.shape[0] == 0:
            continue
        tokens = xg.shape[0]
        # fprop: x along K in 1 x k tiles, W in wbr x k blocks
        assert_within_fp32_accumulation(y[rows], dequantized(xg, 1, block_of(recipe, K), recipe, fwd),
                                        dequantized(wg, wbr, block_of(recipe, K), recipe, fwd), module.bias[g])
        # dgrad: dy along N, W.T along N (square blocks: W's blocks, transposed)
        w_t = (dequantized(wg, wbr, wbr, recipe, fwd).T if wbr > 1 else
               dequantized(wg.T.contiguous(), 1, block_of(recipe, N), recipe, fwd))
        assert_within_fp32_accumulation(x.grad[rows], dequantized(dyg, 1, block_of(recipe, N), recipe, bwd), w_t)
        # wgrad: dy.T and x.T along the group's own tokens, blocks from its first token
        t_block = block_of(recipe, tokens)
        assert_within_fp32_accumulation(module.weight.grad[g],
                                        dequantized(dyg.T.contiguous(), 1, t_block, recipe, bwd),
                                        dequantized(xg.T.contiguous(), 1, t_block, recipe, fwd))


def test_the_bound_fails_when_token_blocks_span_two_groups():
    """The reference bound can fail: quantizing x.T in blocks from the first token of all groups (not of each)
    gives a group whose wgrad differs from its own-block reference by far more than the bound."""
    recipe = BlockScaling()
    x = torch.randn(20, 128) * torch.tensor([100.0] * 10 + [0.01] * 10)[:, None]
    whole = dequantized(x.T.contiguous(), 1, 128, recipe, "e4m3")[:, 10:]  # a block spanning both groups
    own = dequantized(x[10:].T.contiguous(), 1, 128, recipe, "e4m3")
    with pytest.raises(AssertionError, match="max excess"):
        assert_within_fp32_accumulation(whole @ torch.eye(10, dtype=torch.float64), own,
                                        torch.eye(10, dtype=torch.float64))


# ----------------------------------------------------------------------------- shapes and errors
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_experts_stored_in_out_are_each_group_the_block_path_of_a_conv1d_weight_bit_for_bit(recipe):
    """Weights [E, K, N] (gpt-oss's experts, y = x @ W_g): each group as the block path of LinearFunction computes
    a [K, N] weight (transformers' Conv1D) on that group alone, the weight gradient in the stored layout."""
    from fp8mp.functions.grouped_linear import GroupedLinearFunction
    from fp8mp.functions.linear import LinearFunction
    sizes = GROUPINGS["empty_and_partial_blocks"]
    torch.manual_seed(1)
    x = torch.randn(sum(sizes), 160, requires_grad=True)
    w = (torch.randn(len(sizes), 160, 48) / 8).requires_grad_()
    quantizer = quantizer_for(recipe)
    offs = torch.tensor(sizes).cumsum(0).int()
    call = quantizer.begin_grouped(None, x, offs, sizes, None, False, x.dtype, weight_in_out=True)
    y = GroupedLinearFunction.apply(x, w, None, call)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    y.backward(dy)
    assert w.grad.shape == w.shape
    for g, rows in groups(sizes):
        if sizes[g] == 0:
            continue
        xg, wg = x.detach()[rows].clone().requires_grad_(), w.detach()[g].clone().requires_grad_()
        linear_call = quantizer.begin_linear(None, xg, wg, None, False, xg.dtype, weight_in_out=True)
        yg = LinearFunction.apply(xg, wg, None, None, None, linear_call)
        yg.backward(dy[rows])
        assert torch.equal(bits(y.detach()[rows]), bits(yg.detach()))
        assert torch.equal(bits(x.grad[rows]), bits(xg.grad)) and torch.equal(bits(w.grad[g]), bits(wg.grad))


@pytest.mark.parametrize("recipe", RECIPES[::2], ids=RECIPE_IDS[::2])
def test_no_tokens_at_all(recipe):
    module, _ = make([0, 0, 0])
    x = torch.zeros(0, 160, requires_grad=True)
    y, _ = run(module, x, [0, 0, 0], recipe)
    assert y.shape == (0, 48) and not module.weight.grad.any() and not module.bias.grad.any()


@pytest.mark.parametrize("recipe", RECIPES[::2], ids=RECIPE_IDS[::2])
def test_bad_groups_and_dimensions_are_refused_naming_the_argument(recipe):
    module, x = make([5, 0, 12])
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        with pytest.raises(ValueError, match="'offs' must be non-decreasing"):
            module(x, offs=torch.tensor([5, 3, 17], dtype=torch.int32))
        with pytest.raises(ValueError, match="'offs' must end at the input's row count 17"):
            module(x, offs=torch.tensor([5, 5, 16], dtype=torch.int32))
        with pytest.raises(ValueError, match="'m_splits' must have num_gemms = 3 entries, got 2"):
            module(x, [5, 12])
        with pytest.raises(ValueError, match="in_features must be a multiple of 16"):
            GroupedLinear(2, 24, 32)(torch.randn(4, 24), [2, 2])
        with pytest.raises(ValueError, match="out_features must be a multiple of 16"):
            GroupedLinear(2, 32, 40)(torch.randn(4, 32), [2, 2])
