"""fp8mp.nn.Linear (and the modules built on it) under the fine-grained recipes.

Rowwise against torchao's rowwise Float8Linear (emulate) on the same weights: both use the same
power-of-two row scales and exact FP8 products, so they differ only in the order of fp32 additions.
BlockScaling and MXFP8Scaling against a step-by-step composition of the reference quantizers and
the chunked GEMM reference, and against fp32 by SQNR.
"""
from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

import fp8mp
import torchao_reference
from blockwise_reference import block_gemm_reference, deepseek_quantize
from fp8mp.ops.operand import operand_gemm
from fp8mp.scaling.recipe_registry import quantizer_for
from fp8mp.scaling.recipe import BlockScaling, Format, MXFP8Scaling, RowwiseScaling

RECIPES = [RowwiseScaling(), RowwiseScaling(power_of_2_scales=False), BlockScaling(), BlockScaling(power_of_2_scales=True),
           MXFP8Scaling(), MXFP8Scaling("floor"), MXFP8Scaling(fp8_format=Format.HYBRID)]
IDS = ["rowwise", "rowwise-fp32", "block", "block-pow2", "mx-rceil", "mx-floor", "mx-hybrid"]


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    reference, approx = reference.double(), approx.double()
    if torch.equal(reference, approx):
        return math.inf
    return 20 * math.log10(reference.norm().item() / (reference - approx).norm().item())


def pair(in_f, out_f, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.Linear(in_f, out_f)
    fp8 = fp8mp.nn.Linear(in_f, out_f)
    fp8.load_state_dict(ref.state_dict())
    return ref, fp8


def step(module, x, grad, recipe=None):
    x = x.clone().requires_grad_(True)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = module(x)
    out.backward(grad)
    return out, x.grad


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_forward_and_backward_are_close_to_fp32(recipe):
    ref, fp8 = pair(256, 192)
    x, g = torch.randn(4, 40, 256), torch.randn(4, 40, 192)
    out_ref, dx_ref = step(ref, x, g)
    out, dx = step(fp8, x, g, recipe)
    assert out.shape == out_ref.shape and out.dtype == torch.float32
    for a, b in ((out_ref, out), (dx_ref, dx), (ref.weight.grad, fp8.weight.grad)):
        assert sqnr_db(a, b) > 22
    assert torch.allclose(ref.bias.grad, fp8.bias.grad, rtol=1e-6, atol=1e-6)


def test_rowwise_matches_torchao_rowwise_float8linear_emulate():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(192, 160))
    ours = fp8mp.convert(copy.deepcopy(ref))
    theirs = torchao_reference.float8_training(copy.deepcopy(ref), "rowwise")
    x = (torch.randn(96, 192) * torch.exp2(torch.randn(96, 1) * 2)).requires_grad_(True)
    g = torch.randn(96, 160)
    x2 = x.detach().clone().requires_grad_(True)
    out_theirs = theirs(x2)
    out_theirs.backward(g)
    with fp8mp.fp8_autocast(fp8_recipe=RowwiseScaling()):
        out_ours = ours(x)
    out_ours.backward(g)
    # Same scales, exact products: only the fp32 summation order differs (a few fp32 ulps of sum |terms|).
    for a, b in ((out_theirs, out_ours), (x2.grad, x.grad), (theirs[0].weight.grad, ours[0].weight.grad)):
        assert torch.allclose(a, b, rtol=2e-5, atol=1e-5 * a.abs().max().item())
        assert sqnr_db(a, b) > 90


@pytest.mark.parametrize("recipe", [BlockScaling(), MXFP8Scaling()], ids=["block", "mx"])
def test_forward_is_the_reference_quantizers_and_chunked_gemm(recipe):
    """Bit for bit, where the chunk sums are exact in fp32: integer-valued inputs and weights."""
    torch.manual_seed(1)
    x = torch.randint(-6, 7, (24, 256)).float()
    w = torch.randint(-6, 7, (136, 256)).float()
    layer = fp8mp.nn.Linear(256, 136, bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = layer(x)
    if isinstance(recipe, BlockScaling):
        xq, sx = deepseek_quantize(x, 1, 128, torch.float8_e4m3fn)
        wq, sw = deepseek_quantize(w, 128, 128, torch.float8_e4m3fn)
        expected = block_gemm_reference(xq, sx, wq, sw, 1, 128, 128)
    else:
        sx, xq = torchao_reference.to_mx(x, torch.float8_e4m3fn, 32, "rceil")
        sw, wq = torchao_reference.to_mx(w, torch.float8_e4m3fn, 32, "rceil")
        expected = block_gemm_reference(xq, sx.reshape(24, 8), wq, sw.reshape(136, 8), 1, 1, 32)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("recipe", RECIPES[::2], ids=IDS[::2])
def test_conv1d_and_layernorm_linear_and_bf16_run_under_block_recipes(recipe):
    lnl = fp8mp.nn.LayerNormLinear(48, 80)
    conv = fp8mp.nn.Conv1D(64, 80)  # transformers' layout: nf (out) = 64, nx (in) = 80
    x = torch.randn(3, 17, 48, requires_grad=True)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        for _ in range(2):  # the second step takes LayerNormLinear's path for initialized modules
            out = conv(lnl(x))
            out.sum().backward()
    assert conv.weight.grad is not None and lnl.norm.weight.grad is not None and x.grad.isfinite().all()
    layer = fp8mp.nn.Linear(64, 32).bfloat16()
    xb = torch.randn(5, 64, dtype=torch.bfloat16, requires_grad=True)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = layer(xb)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("recipe", RECIPES[::2], ids=IDS[::2])
def test_forward_saves_the_input_in_fp8_and_the_weight_itself_and_backward_requantizes_it_bit_exactly(recipe):
    """No FP8 copy of the weight lives from forward to backward: what is saved is x.T's FP8 codes, their scales and
    the weight parameter; backward's dgrad quantizes the weight again, so it equals a GEMM on forward's operands."""
    _, layer = pair(256, 384, seed=4)
    x = torch.randn(64, 256, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            out = layer(x)
    fp8 = [t for t in saved if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)]
    assert [tuple(t.shape) for t in fp8] == [(256, 64)]  # x.T alone
    assert any(t is layer.weight or t.data_ptr() == layer.weight.data_ptr() for t in saved)
    assert sum(t.numel() for t in saved if t.dtype == torch.float32 and t.data_ptr() != layer.weight.data_ptr()) < 256 * 64
    dy = torch.randn(64, 384)
    (dx,) = torch.autograd.grad(out, x, dy)
    quantizer = quantizer_for(recipe)
    g_q, _ = quantizer.quantize_both(dy, recipe.fp8_format.backward_format)
    w_q, w_t_q = quantizer.quantize_weight(layer.weight.detach())
    assert torch.equal(dx, operand_gemm(g_q, w_q.transposed() if w_t_q is None else w_t_q, None, torch.float32))


def test_per_tensor_fp8_weight_storage_refuses_block_recipes_clearly():
    with fp8mp.fp8_model_init():  # no recipe: one per-tensor scale (tests/nn/test_block_fp8_weights.py stores blocks)
        layer = fp8mp.nn.Linear(32, 16)
    with pytest.raises(RuntimeError, match=r"stored for per-tensor scaling .* runs under BlockScaling, which needs "
                                           r"BlockScaling \(128 x 128 blocks.*fp8_model_init\(recipe=\.\.\.\)"):
        with fp8mp.fp8_autocast(fp8_recipe=BlockScaling()), torch.no_grad():
            layer.eval()(torch.randn(2, 32))


@pytest.mark.parametrize("scaling, cls", [("rowwise", RowwiseScaling), ("block", BlockScaling), ("mxfp8", MXFP8Scaling)])
def test_trainer_config_scaling_names_the_recipes(scaling, cls):
    config = fp8mp.training.TrainerConfig(scaling=scaling)
    assert config.fp8_recipe() == cls(fp8_format=Format.HYBRID)


def test_recipes_are_frozen_and_checked():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BlockScaling().power_of_2_scales = True
    with pytest.raises(ValueError, match="scale_mode must be one of"):
        MXFP8Scaling("even")
    with pytest.raises(ValueError, match="power_of_2_scales must be a bool"):
        RowwiseScaling(power_of_2_scales=1)
    with pytest.raises(ValueError, match="E5M2 x E5M2"):
        with fp8mp.fp8_autocast(fp8_recipe=MXFP8Scaling(fp8_format=Format.E5M2)):
            pass
    assert fp8mp.recipe.MXFP8Scaling is MXFP8Scaling


def _graph_recording_backend(graphs: list):
    """aot_eager that appends the code of every forward and backward graph it compiles to `graphs`."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def record(gm, _example_inputs):
        graphs.append(gm.code)
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=record, bw_compiler=record)


COMPILE_RECIPES = [RowwiseScaling(), BlockScaling(), MXFP8Scaling()]


@pytest.mark.parametrize("recipe", COMPILE_RECIPES, ids=["rowwise", "block", "mx"])
@pytest.mark.parametrize("module_kind", ["Linear", "LayerNormLinear"])
def test_compile_fullgraph_forward_and_backward_equal_eager(recipe, module_kind):
    """No graph break (fullgraph=True raises on one), and outputs and every gradient bit-equal to eager.

    The graphs are the block ops themselves: the forward runs block_quantize_transpose (or, in
    LayerNormLinear under BlockScaling / MXFP8Scaling, the fused norm_fwd_block_fp8) and
    block_scaled_gemm, the backward the dgrad and wgrad block_scaled_gemms.
    """
    torch.manual_seed(0)
    if module_kind == "Linear":
        eager = fp8mp.nn.Linear(160, 96)
    else:
        eager = fp8mp.nn.LayerNormLinear(160, 96)
        with torch.no_grad():
            eager.norm.weight.normal_(1.0, 0.3)
    compiled_module = copy.deepcopy(eager)

    def forward(module, x):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            return module(x)

    torch._dynamo.reset()  # `forward` is one code object for every parametrization: start from an empty cache
    graphs = []
    compiled_forward = torch.compile(forward, backend=_graph_recording_backend(graphs), fullgraph=True)
    compiled_after_step = []
    for i in range(3):
        x, grad = torch.randn(2, 70, 160) * (i + 1) + 0.5, torch.randn(2, 70, 96)
        results = []
        for module, fn in ((eager, forward), (compiled_module, compiled_forward)):
            module.zero_grad()
            xi = x.clone().requires_grad_(True)
            out = fn(module, xi)
            out.backward(grad)
            results.append([out, xi.grad] + [p.grad for p in module.parameters()])
        for a, b in zip(*results):
            assert torch.equal(a, b), i
        compiled_after_step.append(len(graphs))
    # The first step compiles, the second once more (autocast has recorded the module), then no more.
    assert compiled_after_step[1] == compiled_after_step[2] and len(graphs) % 2 == 0
    forward_graph, backward_graph = graphs[-2:]
    fused_norm = module_kind == "LayerNormLinear" and not isinstance(recipe, RowwiseScaling)
    quantize_op = "fp8mp.norm_fwd_block_fp8" if fused_norm else "fp8mp.block_quantize_transpose"
    assert quantize_op in forward_graph and "fp8mp.block_scaled_gemm" in forward_graph
    assert backward_graph.count("fp8mp.block_scaled_gemm") == 2


def test_convert_pins_a_block_recipe():
    model = fp8mp.convert(torch.nn.Sequential(torch.nn.Linear(64, 32)), recipe=MXFP8Scaling("floor"))
    with fp8mp.fp8_autocast():  # the pinned recipe wins over the context's default
        out = model(torch.randn(4, 64))
    assert model[0].fp8_meta.recipe == MXFP8Scaling("floor") and out.isfinite().all()


def test_fp8_group_reduces_nothing_for_block_recipes():
    from fp8mp.scaling import distributed
    layer, group = fp8mp.nn.Linear(64, 32), object()
    with fp8mp.fp8_autocast(fp8_recipe=BlockScaling()):
        layer(torch.randn(4, 64))
    distributed.remember_modules(group, [layer])
    assert distributed._PENDING.pop(group) == {}
    layer.fp8_meta.configure(fp8mp.recipe.CurrentScaling())  # a per-tensor recipe does have amaxes to reduce
    distributed.remember_modules(group, [layer])
    assert list(distributed._PENDING.pop(group)) == [id(layer)]


@pytest.mark.skipif(torch.version.cuda is None, reason="a CPU build of torch cannot initialize CUDA parameters, not even "
                    "fake ones (nn.Linear's uniform_ has no CUDA generator there); the CUDA builds of torch run this")
def test_block_recipes_trace_on_cuda_tensors_and_layernorm_linear_goes_unfused(monkeypatch):
    """FakeTensorMode's CUDA tensors (no GPU needed): every block recipe traces Linear, FP8 weight storage and
    LayerNormLinear (unfused on CUDA, where norm_fwd_block_fp8 has no kernel) through the CUDA fakes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fp8mp.ops import norm as norm_ops

    with FakeTensorMode():
        with pytest.raises(NotImplementedError, match=r"fp8mp.ops.norm_block_fp8 on CUDA tensors: fp8mp has no fused "
                                                      r"CUDA kernel for it"):
            fp8mp.ops.norm.norm_block_fp8(torch.randn(4, 64, device="cuda"), None, None, 1e-5, True, 32, 32)
    monkeypatch.setattr(norm_ops, "norm_block_fp8", lambda *a, **k: pytest.fail("the fused norm has no CUDA kernel"))
    with FakeTensorMode():
        layer = fp8mp.nn.Linear(64, 32, device="cuda")
        lnl = fp8mp.nn.LayerNormLinear(64, 32, device="cuda")
        x = torch.randn(4, 64, device="cuda")  # no backward: the autograd engine wants a real CUDA context
        for recipe in (RowwiseScaling(), BlockScaling(), MXFP8Scaling(), MXFP8Scaling(fp8_format=Format.HYBRID)):
            with fp8mp.fp8_autocast(fp8_recipe=recipe):
                for module in (layer, lnl):
                    out = module(x)
                    assert out.shape == (4, 32) and out.is_cuda
            with fp8mp.fp8_model_init(recipe=recipe):
                stored = fp8mp.nn.Linear(64, 32, device="cuda")
            with fp8mp.fp8_autocast(fp8_recipe=recipe), torch.no_grad():
                assert stored(x).shape == (4, 32)


@pytest.mark.parametrize("recipe", [BlockScaling(), MXFP8Scaling(), MXFP8Scaling(fp8_format=Format.HYBRID)],
                         ids=["block", "mx", "mx-hybrid"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_layernorm_linear_fuses_the_block_cast_into_the_norm_bit_for_bit(recipe, normalization, monkeypatch):
    """The norm kernel writes the block-scaled input itself, and every output and gradient equals the unfused run."""
    from fp8mp.ops import norm as norm_ops

    calls = []
    fused_norm = norm_ops.norm_block_fp8
    monkeypatch.setattr(norm_ops, "norm_block_fp8", lambda *a, **k: calls.append(1) or fused_norm(*a, **k))
    torch.manual_seed(0)
    lnl = fp8mp.nn.LayerNormLinear(160, 96, normalization=normalization)
    with torch.no_grad():
        lnl.norm.weight.normal_(1.0, 0.3)
    x, grad = torch.randn(2, 70, 160) * 2 + 0.5, torch.randn(2, 70, 96)
    results = []
    for fused in (True, False):
        module = lnl if fused else copy.deepcopy(lnl)
        xi = x.clone().requires_grad_(True)
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            out = module(xi) if fused else module.linear(module.norm(xi))
        out.backward(grad)
        results.append([out, xi.grad, module.norm.weight.grad, module.linear.weight.grad, module.linear.bias.grad])
    assert calls == [1]
    for a, b in zip(*results):
        assert torch.equal(a, b)
