"""fp8mp's modules on a GPU against the same modules on the CPU: GroupedLinear (per-tensor and rowwise), the fused
norm + FP8 cast of a per-tensor LayerNormLinear, stored FP8 weights and FP8-saved activations, and DeepSeek-V3 blocks
in the HYBRID format (an E5M2 gradient against an E4M3 weight).

Both devices quantize the same high-precision values to the same FP8 codes and scales (the casts are checked bit for
bit in tests/ops/test_cast_cuda.py and test_blockwise_cuda.py, and again here where a module exposes them), so their
GEMM results differ only by how the products are summed. Each GEMM result is held to the sum of two bounds on
|result - exact sum of the decoded products|: the FP8 tensor cores' (gemm_reference.tensor_core_bound: about 14
significant bits in an MMA's partial sums, DeepSeek-V3 technical report, section 3.3.2) and the CPU's fp32 sum in any
order (K u sum |products|, Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., (3.5)), each evaluated on
an upper bound of the decoded operands' magnitudes (both bounds grow with the magnitudes), plus one unit of the
output's rounding on each side; and to an SQNR of 30 dB (gemm_reference.TENSOR_CORE_MIN_SQNR_DB). Where a result
passes through more than one rounding to FP8 (a norm, a chain of layers), a last-bit difference before a cast can
move one code, so such results are held to an SQNR floor instead, 40 dB as test_blockwise_cuda.py's LayerNormLinear
comparison, far above a wrong kernel's (a dropped 32-wide K slice or a wrong scale gives under 20 dB).

Every test's body runs on the device named by DEVICE: the same code with DEVICE = "cpu" compares the CPU with itself,
which is how the bodies are exercised on machines without a GPU."""
from __future__ import annotations

import copy

import pytest
import torch

import fp8mp
from fp8mp.nn import GroupedLinear
from fp8mp.memory.saved_activations import dequantize_saved, quantize_saved
from fp8mp.ops import fp8_grouped_gemm
from fp8mp.recipe import BlockScaling, DelayedScaling, Format, RowwiseScaling
from gemm_reference import TENSOR_CORE_MIN_SQNR_DB, fp8_randn, tensor_core_bound

DEVICE = "cuda"
needs_fp8_gpu = pytest.mark.skipif(
    not (fp8mp.cuda_kernels_available() and torch.cuda.get_device_capability() >= (8, 9)),
    reason="needs fp8mp CUDA kernels and a GPU of compute capability >= 8.9")
U_FP32 = 2.0 ** -24
CHAINED_MIN_SQNR_DB = 40.0  # results behind more than one FP8 cast (module docstring)
SPLITS = [7, 0, 25, 16]  # an empty group, groups that are not multiples of 16
IN_F, OUT_F = 64, 48


def fp8_magnitude(t: torch.Tensor) -> torch.Tensor:
    """An upper bound of |decoded FP8 value| of each element of `t` (float64) under any of the recipes here: rounding
    to E4M3 or E5M2 moves a normal value by at most 2^-3 of it (E5M2's 2 mantissa bits; OCP FP8 spec), a subnormal
    one by half the smallest subnormal over the scale; the scales here are at least min(1, fp8_max / amax) (the
    initial delayed scale is 1), so 2^-9 max(amax, 1) covers that step for E4M3 and E5M2 alike."""
    t = t.detach().cpu().double().abs()
    amax = float(t.max()) if t.numel() else 0.0
    return t * (1 + 2.0 ** -3) + 2.0 ** -9 * max(amax, 1.0)


def sqnr_db(want: torch.Tensor, got: torch.Tensor) -> float:
    want, got = want.detach().cpu().double(), got.detach().cpu().double()
    return float(20 * torch.log10(want.norm() / (want - got).norm().clamp_min(1e-300)))


def assert_gemms_agree(got: torch.Tensor, want: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """`got` (DEVICE) and `want` (CPU) are FP8 GEMMs of the same codes approximating a @ b.T (a [M, K], b [N, K], high
    precision): elementwise within both devices' accumulation bounds and their outputs' rounding, and 30 dB."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    a_mag, b_mag = fp8_magnitude(a), fp8_magnitude(b)
    k = a_mag.shape[1]
    bound = tensor_core_bound(a_mag, b_mag) + k * U_FP32 * (a_mag @ b_mag.T)
    got64, want64 = got.detach().cpu().double(), want.detach().cpu().double()
    info = torch.finfo(got.dtype)
    tol = bound + 2 * info.eps * (want64.abs() + bound) + 2 * info.tiny
    err = (got64 - want64).abs()
    bad = (err > tol).nonzero()
    assert bad.numel() == 0, (f"{what}: {len(bad)} of {err.numel()} elements off, first at {tuple(bad[0].tolist())}: "
                              f"{got64[tuple(bad[0])].item()!r} against {want64[tuple(bad[0])].item()!r}, "
                              f"tolerance {tol[tuple(bad[0])].item()!r}")
    if want64.numel() and want64.norm() > 0:
        assert sqnr_db(want64, got64) > TENSOR_CORE_MIN_SQNR_DB, what


def assert_column_sums_agree(got: torch.Tensor, want: torch.Tensor, g: torch.Tensor, what: str) -> None:
    """A bias gradient: column sums of the (possibly FP8-decoded) gradient g [T, N] in fp32 on both devices, each
    within (T - 1) u sum |g| of the exact sum (Higham, (4.4))."""
    mag = fp8_magnitude(g)
    tol = 2 * max(mag.shape[0] - 1, 0) * U_FP32 * mag.sum(0) + 2 * torch.finfo(torch.float32).tiny
    err = (got.detach().cpu().double() - want.detach().cpu().double()).abs()
    assert (err <= tol).all(), f"{what}: largest error {err.max().item()!r}"


def both_devices(module: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the CPU module, a copy on DEVICE): the same weights and scaling state."""
    return module, copy.deepcopy(module).to(DEVICE)


def groups(sizes):
    start = 0
    for g, size in enumerate(sizes):
        yield g, slice(start, start + size)
        start += size


# ---------------------------------------------------------------- GroupedLinear


def grouped_step(module, x, grad, recipe, **route):
    module.zero_grad(set_to_none=True)
    xi = x.to(next(module.parameters()).device).requires_grad_(True)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = module(xi, **route)
    out.backward(grad.to(xi.device))
    return out, xi.grad


@needs_fp8_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("recipe", [DelayedScaling(), RowwiseScaling()], ids=["delayed", "rowwise"])
def test_cuda_grouped_linear_forward_and_backward_match_cpu(recipe):
    """GroupedLinearFunction under DelayedScaling (HYBRID: E5M2 gradients) and under RowwiseScaling on the GPU: per
    group, the forward and both gradients within the two devices' GEMM bounds, the bias gradient within fp32
    summation's, the empty group's weight and bias gradients zero, and the scaling state after two steps the CPU's
    bits (amaxes are maxima: no summation order)."""
    torch.manual_seed(0)
    cpu, dev = both_devices(GroupedLinear(len(SPLITS), IN_F, OUT_F))
    for step in range(2):  # the second step runs on the scales the first one's amaxes gave
        x = torch.randn(sum(SPLITS), IN_F) * (1 + step)
        grad = torch.randn(sum(SPLITS), OUT_F) * 0.5
        out_c, dx_c = grouped_step(cpu, x, grad, recipe, m_splits=SPLITS)
        out_d, dx_d = grouped_step(dev, x, grad, recipe, m_splits=SPLITS)
    assert out_d.device.type == DEVICE
    for g, rows in groups(SPLITS):
        w = cpu.weight[g].detach()
        assert_gemms_agree(out_d[rows], out_c[rows], x[rows], w, f"forward, group {g}")
        assert_gemms_agree(dx_d[rows], dx_c[rows], grad[rows], w.T, f"input gradient, group {g}")
        assert_gemms_agree(dev.weight.grad[g], cpu.weight.grad[g], grad[rows].T, x[rows].T,
                           f"weight gradient, group {g}")
        assert_column_sums_agree(dev.bias.grad[g], cpu.bias.grad[g], grad[rows], f"bias gradient, group {g}")
        if SPLITS[g] == 0:
            assert not dev.weight.grad[g].any() and not dev.bias.grad[g].any(), f"empty group {g}"
    for (name, b_c), (_, b_d) in zip(cpu.named_buffers(), dev.named_buffers()):
        assert torch.equal(b_d.cpu(), b_c), name


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_grouped_offsets_on_the_cpu_give_the_device_offsets_bits():
    """fp8_grouped_gemm reads int32 offsets on the CPU beside device operands without a device-to-host copy: the same
    bits as offsets on the device, an empty group included; GroupedLinear routed by device `offs` the bits of the same
    routing by `m_splits`."""
    counts = torch.tensor(SPLITS)
    offs = counts.cumsum(0).to(torch.int32)
    a = fp8_randn((sum(SPLITS), IN_F), torch.float8_e4m3fn, 2.0, seed=1).to(DEVICE)
    b = fp8_randn((len(SPLITS), OUT_F, IN_F), torch.float8_e4m3fn, 1.0, seed=2).to(DEVICE)
    a_scale_inv = torch.tensor([0.37], device=DEVICE)
    b_scale_inv = torch.tensor([0.5, 1.25, 0.75, 2.0], device=DEVICE)
    bias = torch.randn(len(SPLITS), OUT_F).to(torch.bfloat16).to(DEVICE)
    host = fp8_grouped_gemm(a, a_scale_inv, b, b_scale_inv, offs, bias, torch.bfloat16)
    device = fp8_grouped_gemm(a, a_scale_inv, b, b_scale_inv, offs.to(DEVICE), bias, torch.bfloat16)
    assert host.device.type == DEVICE and torch.equal(host.view(torch.int16), device.view(torch.int16))
    want = fp8_grouped_gemm(a.cpu(), a_scale_inv.cpu(), b.cpu(), b_scale_inv.cpu(), offs, bias.cpu(), torch.bfloat16)
    for g, rows in groups(SPLITS):  # and both are the GEMM the CPU computes, within the bounds
        decoded_a = a.cpu()[rows].double() * 0.37
        assert_gemms_agree(host[rows], want[rows], decoded_a, b.cpu()[g].double() * float(b_scale_inv[g]), f"group {g}")

    torch.manual_seed(3)
    module = GroupedLinear(len(SPLITS), IN_F, OUT_F).to(DEVICE)
    x, grad = torch.randn(sum(SPLITS), IN_F), torch.randn(sum(SPLITS), OUT_F)
    by_splits = grouped_step(module, x, grad, RowwiseScaling(), m_splits=SPLITS)
    by_offs = grouped_step(module, x, grad, RowwiseScaling(), offs=offs.to(DEVICE))
    for s, o in zip(by_splits, by_offs):
        assert torch.equal(s, o)


# ---------------------------------------------------------------- the fused norm + FP8 cast


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_layernorm_linear_fused_norm_cast_matches_cpu():
    """layernorm_fwd_fp8 on the GPU writes the FP8 code of its own norm output: the CPU's code wherever the two
    devices' norm outputs have the same bits, else at most one code apart (the norms' fp32 sums differ in order:
    test_norm_cuda.py bounds them); its amax moves by no more than the norm outputs do. Then the per-tensor
    LayerNormLinear under DelayedScaling, whose second step runs the fused kernel: output, input and weight
    gradients at 40 dB of the CPU's (module docstring)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(96, IN_F, generator=gen) * 3 + 1
    weight, bias = torch.rand(IN_F, generator=gen) + 0.5, torch.randn(IN_F, generator=gen)
    scale = torch.tensor([37.0])
    outs = []
    for device in ("cpu", DEVICE):
        args = [t.to(device) for t in (x, weight, bias)]
        amax = torch.zeros(1, device=device)
        codes, _, _ = fp8mp.ops.norm.layer_norm_fp8(*args, 1e-5, scale.to(device), amax, "e4m3")
        normed = fp8mp.ops.norm.layer_norm(*args, 1e-5)
        outs.append((codes.cpu(), amax.cpu(), normed.cpu()))
    (codes_c, amax_c, normed_c), (codes_d, amax_d, normed_d) = outs
    same = normed_c.view(torch.int32) == normed_d.view(torch.int32)
    assert torch.equal(codes_d.view(torch.uint8)[same], codes_c.view(torch.uint8)[same])
    step = codes_c.float().abs().clamp_min(2.0 ** -6) * 2.0 ** -3 + 2.0 ** -9  # one E4M3 code at that magnitude
    assert ((codes_d.float() - codes_c.float()).abs() <= step).all()
    assert (amax_d - amax_c).abs().item() <= (normed_d - normed_c).abs().max().item()

    torch.manual_seed(5)
    cpu, dev = both_devices(fp8mp.nn.LayerNormLinear(IN_F, OUT_F))
    recipe = DelayedScaling()
    results = []
    for module in (cpu, dev):
        for step_i in range(2):  # the first step sets the delayed scales; the second runs fused
            if step_i == 1:
                assert module._runs_fused(recipe)
            module.zero_grad(set_to_none=True)
            xi = (x * (1 + step_i)).to(next(module.parameters()).device).requires_grad_(True)
            with fp8mp.fp8_autocast(fp8_recipe=recipe):
                out = module(xi)
            out.backward(torch.ones_like(out) * 0.25 + xi[:, :OUT_F].detach() * 0.01)
        results.append([out, xi.grad] + [p.grad for p in module.parameters()])
    names = ["output", "input gradient"] + [n for n, _ in cpu.named_parameters()]
    for name, c, d in zip(names, *results):
        assert d.device.type == DEVICE and sqnr_db(c, d) > CHAINED_MIN_SQNR_DB, name


# ---------------------------------------------------------------- stored FP8 weights, FP8-saved activations


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_stored_fp8_weights_and_fp8_saved_activations_match_cpu():
    """convert(frozen_weights="fp8") quantizes each frozen weight on the device it lives on: the CPU's codes and
    scales bit for bit; FP8-saved activations are the CPU's codes and scales and decode to the CPU's bits; an
    fp8_model_init Linear's stored weight read by the GPU's GEMMs within the GEMM bounds; and a converted MLP with
    both trains a step at 40 dB of the CPU (module docstring)."""
    torch.manual_seed(6)
    plain = torch.nn.Sequential(torch.nn.Linear(IN_F, 128), torch.nn.GELU(), torch.nn.Linear(128, OUT_F))
    for layer in (plain[0], plain[2]):
        layer.weight.requires_grad_(False)
    models = [fp8mp.convert(copy.deepcopy(plain).to(device), frozen_weights="fp8", fp8_saved_activations=True)
              for device in ("cpu", DEVICE)]
    for i in (0, 2):
        w_c, w_d = models[0][i].weight, models[1][i].weight
        assert type(w_d).__name__ == "Fp8FrozenWeight" and w_d.codes.device.type == DEVICE
        assert torch.equal(w_d.codes.cpu().view(torch.uint8), w_c.codes.view(torch.uint8)), f"layer {i} codes"
        assert torch.equal(w_d.scale_inv.cpu(), w_c.scale_inv), f"layer {i} scales"

    x = torch.randn(40, 2, 128) * 4
    data_c, scale_c = quantize_saved(x)
    data_d, scale_d = quantize_saved(x.to(DEVICE))
    assert torch.equal(data_d.cpu().view(torch.uint8), data_c.view(torch.uint8)) and torch.equal(scale_d.cpu(), scale_c)
    back_c = dequantize_saved(data_c, scale_c, x.shape, torch.bfloat16)
    back_d = dequantize_saved(data_d, scale_d, x.shape, torch.bfloat16)
    assert torch.equal(back_d.cpu().view(torch.int16), back_c.view(torch.int16))

    with fp8mp.fp8_model_init():
        stored = fp8mp.nn.Linear(IN_F, OUT_F)
    assert stored.stores_fp8_weight
    stored.eval()  # no master weight to train: the input gradient still flows through the stored weight
    cpu_l, dev_l = both_devices(stored)
    xs, grad = torch.randn(32, IN_F), torch.randn(32, OUT_F)
    outs = []
    for layer in (cpu_l, dev_l):
        xi = xs.to(layer.weight_fp8.device).requires_grad_(True)
        with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling()):
            out = layer(xi)
        out.backward(grad.to(xi.device))
        outs.append((out, xi.grad))
    w = (stored.weight_fp8.float().double() * stored.weight_scale_inv.double()).float()
    assert_gemms_agree(outs[1][0], outs[0][0], xs, w, "stored-weight forward")
    assert_gemms_agree(outs[1][1], outs[0][1], grad, w.T, "stored-weight input gradient")

    results = []
    for device, model in zip(("cpu", DEVICE), models):
        xi = torch.randn(24, IN_F, generator=torch.Generator().manual_seed(7)).to(device).requires_grad_(True)
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            xi.grad = None
            with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling()):
                out = model(xi)
            out.square().sum().backward()
        results.append([out, xi.grad, model[0].bias.grad, model[2].bias.grad])
    for name, c, d in zip(["output", "input gradient", "bias 0 gradient", "bias 2 gradient"], *results):
        assert sqnr_db(c, d) > CHAINED_MIN_SQNR_DB, name


# ---------------------------------------------------------------- DeepSeek-V3 blocks, HYBRID


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_deepseek_blocks_hybrid_format_within_the_bound():
    """BlockScaling with the HYBRID format: E4M3 1x128 activations and 128x128 weights forward, E5M2 1x128 gradients
    backward. csrc/blockwise/block_gemm_path.h sends a GEMM with an E5M2 operand to the chunked path on Hopper (its
    native block-scaled mode takes E4M3 x E4M3), so the input gradient (E5M2 x E4M3) and weight gradient
    (E5M2 x E4M3) are a result, not an error: forward and both gradients within the two devices' GEMM bounds."""
    recipe = BlockScaling(fp8_format=Format.HYBRID)
    torch.manual_seed(8)
    cpu, dev = both_devices(fp8mp.nn.Linear(256, 128, bias=False))
    x, grad = torch.randn(48, 256), torch.randn(48, 128)
    results = []
    for module in (cpu, dev):
        xi = x.to(module.weight.device).requires_grad_(True)
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            out = module(xi)
        out.backward(grad.to(xi.device))
        results.append((out, xi.grad, module.weight.grad))
    (out_c, dx_c, dw_c), (out_d, dx_d, dw_d) = results
    w = cpu.weight.detach()
    assert out_d.device.type == DEVICE
    assert_gemms_agree(out_d, out_c, x, w, "forward")
    assert_gemms_agree(dx_d, dx_c, grad, w.T, "input gradient")
    assert_gemms_agree(dw_d, dw_c, grad.T, x.T, "weight gradient")
