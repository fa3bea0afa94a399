"""fp8mp's block-scaled ops on CUDA against the CPU kernels: quantization bit for bit, the GEMM to a stated tolerance.

The CPU kernels are themselves checked against independent references (tests/ops/test_blockwise.py:
torchao's to_mx, torchao's rowwise scaling, a DeepSeek-V3 reference), so bit equality here carries
those checks over to the GPU. Every test needs a GPU and fp8mp's CUDA kernels (`pytest -m cuda`).
"""
from __future__ import annotations

import copy

import pytest
import torch

import fp8mp
from fp8mp.ops import block_quantize, block_quantize_transpose
from opcheck_util import opcheck_fp8_aware
from torch._subclasses.fake_tensor import FakeTensorMode

needs_cuda = pytest.mark.skipif(not fp8mp.cuda_kernels_available(), reason="no CUDA device or fp8mp built without CUDA kernels")

MODES = ["fp32", "pow2", "e8m0_floor", "e8m0_rceil"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (shape, (block_rows, block_cols)): MXFP8 1x32, DeepSeek 1x128 and 128x128 with partial edge tiles,
# rowwise (one tile per row, wider than the row too), odd blocks, 1x1, a tall column.
QUANTIZE_CASES = [((130, 200), (1, 32)), ((257, 300), (1, 128)), ((300, 260), (128, 128)), ((96, 72), (1, 72)),
                  ((20, 50), (1, 64)), ((37, 1000), (7, 5)), ((1, 1), (1, 1)), ((5000, 3), (3, 2))]
QUANTIZE_IDS = ["mx", "1x128", "128x128", "rowwise", "rowwise-wide-block", "odd", "1x1", "tall"]
# (shape, (row_block, col_block)) of block_quantize_transpose.
TRANSPOSE_CASES = [((256, 384), (128, 128)), ((130, 200), (32, 32)), ((96, 72), (72, 96)), ((1, 1), (32, 32)),
                   ((37, 1000), (7, 5)), ((2000, 20), (32, 2000)), ((65, 129), (1, 1))]
TRANSPOSE_IDS = ["block", "mx-partial", "rowwise", "1x1", "odd", "tall", "unit-blocks"]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def hard_input(shape, dtype, seed):
    """Many exponents per tile; a zero row, a tiny and a huge row; NaN, -NaN, +Inf and -Inf elements."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2((torch.rand(shape, generator=g) * 2 - 1) * 8)
    rows, cols = shape
    if rows > 3:
        x[0] = 0
        x[1] *= 1e-38
        x[2] *= 1e30
    n = x.numel()
    if n > 16:
        flat = x.view(-1)
        flat[n // 3] = float("nan")
        flat[n // 2] = float("inf")
        flat[(2 * n) // 3] = -float("inf")
        flat[n // 5] = -float("nan")  # its sign must reach the code on both devices
    return x.to(dtype)


@needs_cuda
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape,block", QUANTIZE_CASES, ids=QUANTIZE_IDS)
def test_cuda_block_quantize_equals_cpu_bit_for_bit(shape, block, dtype, fmt, mode):
    x = hard_input(shape, dtype, seed=shape[0] + block[1])
    data, scale_inv = block_quantize(x, *block, fmt, mode)
    data_gpu, scale_inv_gpu = block_quantize(x.cuda(), *block, fmt, mode)
    assert data_gpu.is_cuda and data_gpu.dtype == data.dtype and scale_inv_gpu.dtype == scale_inv.dtype
    assert torch.equal(bits(data_gpu.cpu()), bits(data))
    assert torch.equal(bits(scale_inv_gpu.cpu()), bits(scale_inv))


@needs_cuda
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape,blocks", TRANSPOSE_CASES, ids=TRANSPOSE_IDS)
def test_cuda_block_quantize_transpose_equals_cpu_bit_for_bit(shape, blocks, dtype, fmt, mode):
    x = hard_input(shape, dtype, seed=shape[1] + blocks[0])
    cpu = block_quantize_transpose(x, *blocks, fmt, mode)
    gpu = block_quantize_transpose(x.cuda(), *blocks, fmt, mode)
    for got, want in zip(gpu, cpu):
        assert got.is_cuda and got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(bits(got.cpu()), bits(want))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", MODES)
def test_cuda_block_quantize_every_16bit_pattern_equals_cpu(dtype, mode):
    """All 65536 bit patterns (NaN payloads, subnormals, Inf), in 1x32 tiles and in both layouts of 32x32."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256)
    for fmt in ("e4m3", "e5m2"):
        for got, want in zip(block_quantize(x.cuda(), 1, 32, fmt, mode), block_quantize(x, 1, 32, fmt, mode)):
            assert torch.equal(bits(got.cpu()), bits(want))
        cpu = block_quantize_transpose(x, 32, 32, fmt, mode)
        gpu = block_quantize_transpose(x.cuda(), 32, 32, fmt, mode)
        for got, want in zip(gpu, cpu):
            assert torch.equal(bits(got.cpu()), bits(want))


@needs_cuda
def test_cuda_non_contiguous_and_offset_inputs_equal_cpu():
    """Views taken on the device (`view.cuda()` of a CPU view would copy into a fresh, aligned, contiguous allocation):
    transposed, offset by one row and 3 columns (a data pointer off 16-byte alignment) and every other row."""
    base = hard_input((300, 257), torch.bfloat16, seed=9)
    base_gpu = base.cuda()
    for view in (lambda t: t.t(), lambda t: t[1:, 3:], lambda t: t[::2]):
        x, x_gpu = view(base), view(base_gpu)
        assert x_gpu.stride() == x.stride() and x_gpu.storage_offset() == x.storage_offset()
        if x.storage_offset():
            assert x_gpu.data_ptr() % 16 != 0
        for got, want in zip(block_quantize(x_gpu, 1, 128, "e4m3", "fp32"), block_quantize(x, 1, 128, "e4m3", "fp32")):
            assert torch.equal(bits(got.cpu()), bits(want))
        for got, want in zip(block_quantize_transpose(x_gpu, 32, 32, "e4m3", "e8m0_rceil"),
                             block_quantize_transpose(x, 32, 32, "e4m3", "e8m0_rceil")):
            assert torch.equal(bits(got.cpu()), bits(want))


@needs_cuda
def test_cuda_empty_inputs_give_empty_outputs():
    for shape in ((0, 64), (64, 0)):
        x = torch.empty(shape, device="cuda")
        data, scale_inv = block_quantize(x, 1, 32, "e4m3", "fp32")
        assert data.shape == shape and scale_inv.shape == (shape[0], -(-shape[1] // 32))
        assert [t.shape for t in block_quantize_transpose(x, 32, 32, "e4m3", "fp32")] == \
               [t.shape for t in block_quantize_transpose(x.cpu(), 32, 32, "e4m3", "fp32")]


@needs_cuda
@pytest.mark.parametrize("mode", ["fp32", "pow2", "e8m0_floor", "e8m0_rceil"])
def test_opcheck_block_quantize_cuda(mode):
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize.default, (torch.randn(33, 70, device="cuda"), 1, 32, "e4m3", mode))
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize.default,
                      (torch.randn(130, 70, device="cuda").bfloat16(), 128, 128, "e5m2", mode))
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize_transpose.default,
                      (torch.randn(40, 24, device="cuda").half(), 24, 40, "e5m2", mode))


@needs_cuda
def test_cuda_kernels_refuse_what_the_cpu_kernels_refuse():
    from opcheck_util import error_of
    from test_blockwise import BAD_CALLS

    for name, call in BAD_CALLS.items():
        if name.startswith(("quantize", "transpose")):
            assert error_of(call, "cuda") == error_of(call, "cpu"), name


# ---------------------------------------------------------------- block_scaled_gemm on CUDA vs the CPU emulation
# (name, a blocks (rows, block_k) of block_quantize, b blocks, GEMM block rows of a and b, scale mode, formats of a, b)
GEMM_RECIPES = {
    "rowwise": ((1, None), (1, None), 1, 1, "pow2", ("e4m3", "e4m3")),
    "rowwise-fp32": ((1, None), (1, None), 1, 1, "fp32", ("e4m3", "e4m3")),
    "deepseek-fprop": ((1, 128), (128, 128), 1, 128, "fp32", ("e4m3", "e4m3")),
    "deepseek-wgrad": ((1, 128), (1, 128), 1, 1, "fp32", ("e4m3", "e4m3")),
    "deepseek-128x128-a": ((128, 128), (1, 128), 128, 1, "fp32", ("e4m3", "e4m3")),
    "mxfp8-rceil": ((1, 32), (1, 32), 1, 1, "e8m0_rceil", ("e4m3", "e4m3")),
    "mxfp8-floor-hybrid": ((1, 32), (1, 32), 1, 1, "e8m0_floor", ("e5m2", "e4m3")),
}
# Every recipe runs on every FP8 GPU (csrc/blockwise/block_gemm_path.h): cuBLASLt's own block scale mode where
# it has one (rowwise and DeepSeek-V3 on 9.x, MXFP8 on 10.x / 12.x), FP8 GEMMs per K chunk elsewhere.
# FP8MP_BLOCK_GEMM_PATH=chunked takes the chunked path on any of them.
FP8_CAPABILITY = (8, 9)
PATHS = ["auto", "chunked"]


def _quantized_operands(name, M, N, K, seed, a_scale=1.0):
    (a_rows, a_k), (b_rows, b_k), a_block_rows, b_block_rows, mode, (fa, fb) = GEMM_RECIPES[name]
    block_k = a_k or K
    g = torch.Generator().manual_seed(seed)
    # Per-row and per-chunk magnitudes over many binades, so that a scale applied to the wrong row or
    # chunk changes the result by far more than the tolerance.
    a = torch.randn(M, K, generator=g) * torch.exp2(torch.randint(-6, 7, (M, 1), generator=g).float()) \
        * torch.exp2(torch.randint(-6, 7, (1, K), generator=g).float()) * a_scale
    b = torch.randn(N, K, generator=g) * torch.exp2(torch.randint(-6, 7, (N, 1), generator=g).float())
    qa, sa = block_quantize(a, a_rows, block_k, fa, mode)
    qb, sb = block_quantize(b, b_rows, block_k, fb, mode)
    return (qa, sa, qb, sb, a_block_rows, b_block_rows, block_k)


def _dequantized(qa, sa, qb, sb, a_block_rows, b_block_rows, block_k):
    """float64 values of both operands with their scales expanded over their blocks: the exact products."""
    from blockwise_reference import decode_scale

    def values(q, s, block_rows):
        rows, cols = q.shape
        scale = decode_scale(s).double().repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_k, 1)[:, :cols]
        return q.float().double() * scale

    return values(qa, sa, a_block_rows), values(qb, sb, b_block_rows)


def _assert_within_tensor_core_bound(gpu, operands, bias, out_dtype):
    """The GPU's block-scaled GEMM against the float64 GEMM of the dequantized operands, within the FP8 tensor
    cores' bound (tests/gemm_reference.py: about 14 significant bits in an MMA's partial sums, DeepSeek-V3 section
    3.3.2), the accumulator promoted to fp32 every K block (where its scales apply), the bias added in fp32."""
    from gemm_reference import assert_within_tensor_core_bound, tensor_core_bound

    a64, b64 = _dequantized(*operands)
    ref64 = a64 @ b64.T
    bound = tensor_core_bound(a64, b64, promote_every=operands[-1])
    if bias is not None:
        ref64 = ref64 + bias.double()
        bound = bound + 2.0 ** -24 * (ref64.abs() + bound)
    assert_within_tensor_core_bound(gpu, ref64, bound, out_dtype)


def _gpu_can_run(name) -> bool:
    return torch.cuda.get_device_capability() >= FP8_CAPABILITY


@pytest.fixture(params=PATHS)
def block_gemm_path(request, monkeypatch):
    """Each test once on the path this GPU takes by itself and once on the chunked path."""
    monkeypatch.setenv("FP8MP_BLOCK_GEMM_PATH", request.param)
    return request.param


@needs_cuda
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("name", list(GEMM_RECIPES))
def test_cuda_block_scaled_gemm_matches_the_cpu_emulation(name, with_bias, out_dtype, block_gemm_path):
    """Tolerance from the arithmetic: both devices multiply the FP8 values exactly and apply the same two
    scales per K chunk; only the order and, in the tensor cores, the width of the additions differ. The GPU's
    result lies within the FP8 tensor cores' bound of the float64 GEMM of the dequantized operands
    (gemm_reference.tensor_core_bound: about 14 significant bits in an MMA's partial sums, DeepSeek-V3 section
    3.3.2; promoted to fp32 every K block, where the scales apply), plus one unit of out_dtype's rounding. Both
    devices add the bias in fp32 and round once. A scale applied to the wrong row, block or chunk is off by a
    power of two or more."""
    M, N, K = 70, 200, 300  # none a multiple of 16, 32 or 128: every padding path
    # float16 outputs: a scaled down so that no output comes near float16's 65504 (an overflow on one
    # device and 65504 on the other would be an infinite difference).
    operands = _quantized_operands(name, M, N, K, seed=len(name), a_scale=2.0 ** -12 if out_dtype == torch.float16 else 1.0)
    qa, sa, qb, sb, a_block_rows, b_block_rows, block_k = operands
    bias = torch.randn(N).to(out_dtype) if with_bias else None
    cpu = fp8mp.ops.block_scaled_gemm(qa, sa, qb, sb, a_block_rows, b_block_rows, block_k, bias, out_dtype)
    args = [t.cuda() for t in (qa, sa, qb, sb)]
    call = lambda: fp8mp.ops.block_scaled_gemm(args[0], args[1], args[2], args[3], a_block_rows, b_block_rows, block_k,
                                               None if bias is None else bias.cuda(), out_dtype)
    if not _gpu_can_run(name):
        with pytest.raises(RuntimeError, match=r"compute capability 8\.9 or newer.* has compute capability"):
            call()
        return
    gpu = call().cpu()
    assert gpu.dtype == out_dtype and gpu.shape == (M, N)
    _assert_within_tensor_core_bound(gpu, operands, bias, out_dtype)
    # The bound is a worst case; the typical error is far smaller: 14-bit partial sums over K = 300 leave
    # about 60 dB, a bf16 output's rounding about 55 dB. 45 dB against the CPU catches what the bound would
    # let through, such as one K chunk's scale off by a small factor.
    sqnr = 20 * torch.log10(cpu.double().norm() / (gpu.double() - cpu.double()).norm().clamp_min(1e-300))
    assert sqnr > 45, sqnr


def _exact_operands(name, M, N, K, seed):
    """Operands whose every partial sum is exact in the FP8 tensor cores' accumulator (about 14 significant bits,
    DeepSeek-V3 section 3.3.2) as well as in fp32, in any order. Each value is a small integer times a power of
    two per 128-row block, and every 32nd column holds +-7 of that power: every quantization tile (whose columns
    start at a multiple of 32) then has amax 7 * 2^e, which every scale mode maps to the power of two
    (fp32 and pow2: 448 / 7 = 64; e8m0: 2^(2 - 8)), so the E4M3 codes are 64 * i (E5M2: 8192 * i), |i| <= 7.
    The products are multiples of one unit, and a chunk's sum of |products| is at most
    (K / 32) * 49 + K * 4 units (the markers, then |i| <= 2 elsewhere): 1650 for K = 300, under 2^12, so no partial
    sum, accumulator included, needs more than 12 significant bits and the tensor cores drop none. Then the GPU's
    chunk sums equal the CPU's bit for bit, and what is left to compare is how the chunks' sums and scales are
    combined."""
    (a_rows, a_k), (b_rows, b_k), a_block_rows, b_block_rows, mode, (fa, fb) = GEMM_RECIPES[name]
    block_k = a_k or K
    g = torch.Generator().manual_seed(seed)

    def operand(rows):
        blocks = -(-rows // 128)
        exponents = torch.randint(-5, 6, (blocks, 1), generator=g).float().repeat_interleave(128, 0)[:rows]
        values = torch.randint(-2, 3, (rows, K), generator=g).float()
        values[:, ::32] = 7 * (torch.randint(0, 2, (rows, values[:, ::32].shape[1]), generator=g).float() * 2 - 1)
        return values * torch.exp2(exponents)

    a, b = operand(M), operand(N)
    qa, sa = block_quantize(a, a_rows, block_k, fa, mode)
    qb, sb = block_quantize(b, b_rows, block_k, fb, mode)
    units = {torch.float8_e4m3fn: 64, torch.float8_e5m2: 8192}
    for q in (qa, qb):  # the codes are the small integers the bound above counts
        codes = q.float() / units[q.dtype]
        assert torch.equal(codes, codes.round()) and codes.abs().max() == 7
    return qa, sa, qb, sb, a_block_rows, b_block_rows, block_k


@needs_cuda
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(GEMM_RECIPES))
def test_cuda_chunked_block_scaled_gemm_equals_the_cpu_bit_for_bit_where_chunk_sums_are_exact(name, out_dtype,
                                                                                             monkeypatch):
    """The chunked path folds the chunks as the CPU does, acc = acc + d_c * (sa * sb) in chunk order, then
    adds the bias and rounds once: with exact chunk sums the two devices agree in every bit."""
    monkeypatch.setenv("FP8MP_BLOCK_GEMM_PATH", "chunked")
    M, N, K = 37, 50, 300
    qa, sa, qb, sb, a_block_rows, b_block_rows, block_k = _exact_operands(name, M, N, K, seed=3)
    bias = torch.randn(N).to(out_dtype)
    cpu = fp8mp.ops.block_scaled_gemm(qa, sa, qb, sb, a_block_rows, b_block_rows, block_k, bias, out_dtype)
    gpu = fp8mp.ops.block_scaled_gemm(qa.cuda(), sa.cuda(), qb.cuda(), sb.cuda(), a_block_rows, b_block_rows, block_k,
                                      bias.cuda(), out_dtype)
    assert torch.equal(bits(gpu.cpu()), bits(cpu))


@needs_cuda
@pytest.mark.parametrize("M", [1, 3, 4, 12, 17])
@pytest.mark.parametrize("name", ["deepseek-fprop", "deepseek-wgrad", "deepseek-128x128-a"])
def test_cuda_deepseek_gemm_takes_any_number_of_rows(name, M, block_gemm_path):
    """cuBLASLt's VEC128_32F operand is padded to a multiple of 8 rows (M mod 8 in 1..4 once failed);
    M = 1..17 on both paths, against the CPU emulation (exact chunk sums: bit for bit on the chunked path,
    within the accumulation-order bound on the native one)."""
    N, K = 40, 260
    qa, sa, qb, sb, a_block_rows, b_block_rows, block_k = _exact_operands(name, M, N, K, seed=M)
    cpu = fp8mp.ops.block_scaled_gemm(qa, sa, qb, sb, a_block_rows, b_block_rows, block_k, None, torch.float32)
    gpu = fp8mp.ops.block_scaled_gemm(qa.cuda(), sa.cuda(), qb.cuda(), sb.cuda(), a_block_rows, b_block_rows, block_k,
                                      None, torch.float32).cpu()
    assert gpu.shape == (M, N)
    if block_gemm_path == "chunked":
        assert torch.equal(bits(gpu), bits(cpu))
    else:
        _assert_within_tensor_core_bound(gpu, (qa, sa, qb, sb, a_block_rows, b_block_rows, block_k), None,
                                         torch.float32)


@needs_cuda
def test_cuda_block_gemm_path_setting_is_checked(monkeypatch):
    monkeypatch.setenv("FP8MP_BLOCK_GEMM_PATH", "fastest")
    qa, sa, qb, sb, a_block_rows, b_block_rows, block_k = [
        t.cuda() if isinstance(t, torch.Tensor) else t for t in _exact_operands("rowwise", 4, 16, 32, seed=0)]
    with pytest.raises(RuntimeError, match=r"FP8MP_BLOCK_GEMM_PATH must be 'auto' or 'chunked', got 'fastest'"):
        fp8mp.ops.block_scaled_gemm(qa, sa, qb, sb, a_block_rows, b_block_rows, block_k, None, torch.float32)


@needs_cuda
def test_cuda_block_scaled_gemm_k_zero_gives_the_bias():
    E4M3 = torch.float8_e4m3fn
    a, b = torch.empty(3, 0, dtype=E4M3, device="cuda"), torch.empty(2, 0, dtype=E4M3, device="cuda")
    bias = torch.tensor([1.5, -2.0], device="cuda")
    out = fp8mp.ops.block_scaled_gemm(a, torch.empty(3, 0, device="cuda"), b, torch.empty(2, 0, device="cuda"), 1, 1,
                                      32, bias, torch.float32)
    assert torch.equal(out.cpu(), bias.cpu().expand(3, 2))


@needs_cuda
def test_cuda_block_scaled_gemm_refuses_blocks_no_cublaslt_recipe_takes_like_its_fake():
    from opcheck_util import error_of

    E4M3 = torch.float8_e4m3fn

    def call(device):  # 1 x 64 blocks: fine on CPU, no cuBLASLt mode
        a, b = torch.ones(4, 128, device=device).to(E4M3), torch.ones(3, 128, device=device).to(E4M3)
        return torch.ops.fp8mp.block_scaled_gemm(a, torch.ones(4, 2, device=device), b, torch.ones(3, 2, device=device),
                                                 1, 1, 64, None, torch.float32)

    call("cpu")
    kind, message = error_of(call, "cuda")
    assert kind is RuntimeError and "on CUDA the blocks must be those of a recipe cuBLASLt runs" in message
    with FakeTensorMode():
        with pytest.raises(RuntimeError) as fake:
            call("cuda")
    assert str(fake.value) == message


@needs_cuda
def test_opcheck_block_scaled_gemm_cuda():
    name = "rowwise" if _gpu_can_run("rowwise") else None
    if name is None:
        pytest.skip("no cuBLASLt block-scaled recipe on this GPU")
    qa, sa, qb, sb, a_rows, b_rows, block_k = [t.cuda() if isinstance(t, torch.Tensor) else t
                                               for t in _quantized_operands(name, 33, 40, 70, seed=1)]
    opcheck_fp8_aware(torch.ops.fp8mp.block_scaled_gemm.default,
                      (qa, sa, qb, sb, a_rows, b_rows, block_k, torch.randn(40, device="cuda"), torch.float32))


# ---------------------------------------------------------------- the modules on CUDA vs CPU
@needs_cuda
@pytest.mark.parametrize("module_kind", ["Linear", "LayerNormLinear"])
@pytest.mark.parametrize("recipe_name", ["rowwise", "deepseek", "mxfp8"])
def test_cuda_block_linear_forward_and_backward_close_to_cpu(recipe_name, module_kind, block_gemm_path):
    """Same weights and inputs on both devices: quantization is bit-exact, so outputs and gradients differ
    only by the GEMMs' accumulation order (tolerance of test_cuda_block_scaled_gemm_matches_the_cpu_emulation,
    here checked as an SQNR of 60 dB, far above the ~30 dB of FP8 itself). LayerNormLinear: 40 dB, as the
    CPU and CUDA norm kernels may differ in the last bit of an output, which can move an FP8 code by one."""
    from fp8mp.scaling.recipe import BlockScaling, MXFP8Scaling, RowwiseScaling

    recipe = {"rowwise": RowwiseScaling(), "deepseek": BlockScaling(), "mxfp8": MXFP8Scaling()}[recipe_name]
    torch.manual_seed(0)
    cpu_module = fp8mp.nn.Linear(256, 192) if module_kind == "Linear" else fp8mp.nn.LayerNormLinear(256, 192)
    gpu_module = copy.deepcopy(cpu_module).cuda()
    x, grad = torch.randn(4, 40, 256), torch.randn(4, 40, 192)
    results = []
    for module, device in ((cpu_module, "cpu"), (gpu_module, "cuda")):
        xi = x.to(device).requires_grad_(True)
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            if device == "cuda" and not _gpu_can_run(recipe_name):
                with pytest.raises(RuntimeError, match=r"compute capability 8\.9 or newer"):
                    module(xi)
                return
            out = module(xi)
        out.backward(grad.to(device))
        results.append([out, xi.grad] + [p.grad for p in module.parameters()])
    for c, g in zip(*results):
        c, g = c.double(), g.cpu().double()
        assert 20 * torch.log10(c.norm() / (c - g).norm().clamp_min(1e-30)) > (60 if module_kind == "Linear" else 40)
