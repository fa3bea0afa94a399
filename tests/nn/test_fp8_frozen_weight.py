"""fp8mp.nn.Fp8FrozenWeight and convert(frozen_weights="fp8"): frozen weights stored as E4M3 codes plus fp32
scales, read as their original dtype. References: torch's float8_e4m3fn cast (round to nearest even) and
ml_dtypes' decode in fp64."""
from __future__ import annotations

import copy
import io

import ml_dtypes
import numpy as np
import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.nn import Fp8FrozenWeight, decode_frozen_weights, store_frozen_weights_in_fp8, tensor_bytes

E4M3_MAX = 448.0


def reference_quantize(weight: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(codes as uint8, scale_inv fp32): current scaling per leading index (one group for 2-D) with torch's cast."""
    groups = weight.float().reshape(1 if weight.dim() == 2 else weight.shape[0], -1)
    amax = groups.abs().amax(dim=1)
    scale = torch.tensor(E4M3_MAX, dtype=torch.float32) / amax
    codes = (groups * scale[:, None]).to(torch.float8_e4m3fn)
    return codes.view(torch.uint8).reshape(weight.shape).numpy(), scale.reciprocal().numpy()


def reference_decode(codes_u8: np.ndarray, scale_inv: np.ndarray) -> np.ndarray:
    """codes * scale_inv in fp64 (exact: 4 significant bits times 24), from ml_dtypes' E4M3 decode."""
    values = codes_u8.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return values * scale_inv.astype(np.float64).reshape(-1, *([1] * (codes_u8.ndim - 1)))


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor


@pytest.mark.parametrize("shape", [(32, 64), (3, 48, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codes_and_scales_are_current_scaling_per_tensor_or_per_expert(shape, dtype):
    torch.manual_seed(0)
    weight = (torch.randn(shape) * torch.logspace(-3, 2, shape[0]).reshape(-1, *([1] * (len(shape) - 1)))).to(dtype)
    stored = Fp8FrozenWeight.from_tensor(weight)
    codes, scale_inv = reference_quantize(weight)
    assert stored.codes.dtype == torch.float8_e4m3fn and stored.scale_inv.dtype == torch.float32
    assert stored.scale_inv.shape == ((1,) if len(shape) == 2 else (shape[0],))
    np.testing.assert_array_equal(bits(stored.codes).numpy(), codes)
    np.testing.assert_array_equal(stored.scale_inv.numpy(), scale_inv)
    # what a reader gets: the fp64 decode, rounded once to the reported dtype
    expected = torch.from_numpy(reference_decode(codes, scale_inv)).to(dtype)
    assert torch.equal(stored.float().to(dtype) if dtype != torch.float32 else stored * 1, expected)


@pytest.mark.parametrize("shape", [(32, 64), (4, 16, 32)])
def test_codes_are_what_a_current_scaling_cast_of_the_decoded_weight_gives(shape):
    torch.manual_seed(1)
    weight = torch.randn(shape) * 3
    weight.view(-1)[5] = 1e-6  # a code in E4M3's subnormal range
    stored = Fp8FrozenWeight.from_tensor(weight)
    recast, _ = reference_quantize(stored.decode(torch.float32))
    np.testing.assert_array_equal(bits(stored.codes).numpy(), recast)


def test_a_reader_sees_the_original_dtype_shape_and_decoded_values():
    torch.manual_seed(2)
    weight = torch.randn(32, 64, dtype=torch.bfloat16)
    w = torch.nn.Parameter(Fp8FrozenWeight.from_tensor(weight), requires_grad=False)
    decoded = w.decode()
    assert isinstance(w, torch.nn.Parameter) and isinstance(w, Fp8FrozenWeight)
    assert (w.shape, w.dtype, w.device, w.requires_grad) == (weight.shape, torch.bfloat16, weight.device, False)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    for result, expected in [(F.linear(x, w), F.linear(x, decoded)), (w @ x.T, decoded @ x.T), (w[3], decoded[3]),
                             (w.sum(), decoded.sum()), (w.t().contiguous(), decoded.t().contiguous())]:
        assert type(result) is torch.Tensor and torch.equal(result, expected)
    # a dtype change keeps the codes and changes the reported dtype: float() decodes in fp32, not via bf16
    assert type(w.float()) is Fp8FrozenWeight and torch.equal(w.float() * 1, w.decode(torch.float32))
    np.testing.assert_array_equal(w.float().numpy(), w.decode(torch.float32).numpy())
    assert w.float().tolist() == w.decode(torch.float32).tolist()
    assert "Fp8FrozenWeight" in repr(w)


def test_expert_weights_work_with_grouped_mm():
    torch.manual_seed(3)
    experts = torch.randn(3, 32, 16, dtype=torch.bfloat16)
    w = Fp8FrozenWeight.from_tensor(experts)
    x = torch.randn(10, 32, dtype=torch.bfloat16)
    offs = torch.tensor([2, 7, 10], dtype=torch.int32)
    assert torch.equal(torch._grouped_mm(x, w, offs=offs), torch._grouped_mm(x, w.decode(), offs=offs))


def test_detach_clone_and_moves_keep_the_fp8_storage():
    w = Fp8FrozenWeight.from_tensor(torch.randn(16, 32))
    for kept in (w.detach(), w.clone(), w.to("cpu"), w.to(torch.bfloat16), torch.nn.Parameter(w, requires_grad=False)):
        assert type(kept) is Fp8FrozenWeight and torch.equal(bits(kept.codes), bits(w.codes))
        assert torch.equal(kept.scale_inv, w.scale_inv)
    assert w.clone().codes.data_ptr() != w.codes.data_ptr() and w.detach().codes.data_ptr() == w.codes.data_ptr()
    assert w.to(torch.bfloat16).dtype == torch.bfloat16
    model = torch.nn.Linear(32, 16).requires_grad_(False)
    store_frozen_weights_in_fp8(model)
    model.bfloat16()
    assert type(model.weight) is Fp8FrozenWeight and model.weight.dtype == torch.bfloat16
    assert model.weight.codes.dtype == torch.float8_e4m3fn and model.bias.dtype == torch.bfloat16


@pytest.mark.parametrize("write", [lambda w: w.add_(1), lambda w: w.mul_(2), lambda w: w.zero_(),
                                   lambda w: w.data.add_(1), lambda w: torch.add(w, 1, out=w)])
def test_in_place_writes_are_refused_with_what_to_do(write):
    w = Fp8FrozenWeight.from_tensor(torch.randn(16, 32))
    before = bits(w.codes).clone()
    with pytest.raises(RuntimeError, match="frozen FP8 weight.*decode_frozen_weights"):
        write(w)
    assert torch.equal(bits(w.codes), before)


def test_copy_requantizes_and_copies_fp8_sources_code_for_code():
    torch.manual_seed(4)
    w = Fp8FrozenWeight.from_tensor(torch.randn(3, 16, 32))
    source = torch.randn(3, 16, 32) * 5
    w.copy_(source)
    codes, scale_inv = reference_quantize(source)
    np.testing.assert_array_equal(bits(w.codes).numpy(), codes)
    np.testing.assert_array_equal(w.scale_inv.numpy(), scale_inv)
    other = Fp8FrozenWeight.from_tensor(torch.randn(3, 16, 32))
    w.copy_(other)
    assert torch.equal(bits(w.codes), bits(other.codes)) and torch.equal(w.scale_inv, other.scale_inv)


def test_from_tensor_refuses_bad_input():
    for bad in (torch.randn(4), torch.randn(2, 2, 2, 2), torch.ones(4, 4, dtype=torch.int32), [[1.0]]):
        with pytest.raises(TypeError, match="argument 'weight'"):
            Fp8FrozenWeight.from_tensor(bad)
    with pytest.raises(ValueError, match="argument 'frozen_weights'"):
        fp8mp.convert(torch.nn.Linear(16, 16), frozen_weights="int8")


def test_tensor_bytes_counts_codes_and_scales_against_the_formula():
    dense = torch.randn(64, 128)
    experts = torch.randn(4, 32, 16)
    frozen = [Fp8FrozenWeight.from_tensor(dense), Fp8FrozenWeight.from_tensor(experts)]
    assert tensor_bytes(frozen) == 64 * 128 + 4 + 4 * 32 * 16 + 4 * 4
    assert tensor_bytes([dense, dense, dense[1:]]) == dense.numel() * 4  # one storage counted once


class TinyMoE(torch.nn.Module):
    """Embedding, norm, two Linears, a 3-D expert weight, a Conv1d, a tied head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.up = torch.nn.Linear(32, 48)
        self.down = torch.nn.Linear(48, 32)
        self.experts = torch.nn.Module()
        self.experts.gate_up_proj = torch.nn.Parameter(torch.randn(4, 64, 32))
        self.conv = torch.nn.Conv1d(4, 4, 3)
        self.head = torch.nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight
        self.trained = torch.nn.Linear(32, 32)


def test_store_picks_frozen_linear_and_expert_weights_only():
    model = TinyMoE().requires_grad_(False)
    model.trained.requires_grad_(True)
    fp8mp.convert(model, frozen_weights="fp8")
    frozen = {name for name, p in model.named_parameters() if isinstance(p, Fp8FrozenWeight)}
    assert frozen == {"up.weight", "down.weight", "experts.gate_up_proj"}
    assert model.experts.gate_up_proj.scale_inv.shape == (4,)
    assert model.head.weight is model.embed.weight and type(model.embed.weight) is torch.nn.Parameter
    assert all(not p.requires_grad for name, p in model.named_parameters() if name in frozen)


def test_fp8_linear_feeds_the_stored_codes_to_the_gemm(monkeypatch):
    torch.manual_seed(5)
    plain = fp8mp.nn.Linear(64, 32).requires_grad_(False)
    frozen = fp8mp.nn.Linear(64, 32).requires_grad_(False)
    frozen.load_state_dict(plain.state_dict())
    store_frozen_weights_in_fp8(frozen)
    plain.weight.copy_(frozen.weight.decode())  # the same values in high precision: the cast gives the same codes
    x = torch.randn(8, 64, requires_grad=True)
    recipe = fp8mp.recipe.CurrentScaling()
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        expected = plain(x)
    monkeypatch.setattr(Fp8FrozenWeight, "decode", lambda *a, **k: pytest.fail("the FP8 forward decoded the weight"))
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = frozen(x)
    assert torch.equal(out, expected)
    out.sum().backward()
    assert x.grad is not None and frozen.weight.grad is None


def test_state_dict_holds_codes_and_scale_inv_and_round_trips(tmp_path):
    torch.manual_seed(6)
    model = TinyMoE().requires_grad_(False)
    fp8mp.convert(model, frozen_weights="fp8")
    state = model.state_dict()
    assert state["up.weight"].dtype == torch.float8_e4m3fn and type(state["up.weight"]) is torch.Tensor
    assert state["up.weight_scale_inv"].shape == (1,) and state["experts.gate_up_proj_scale_inv"].shape == (4,)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded_torch = torch.load(buffer, weights_only=True)
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items() if k != "head.weight"}, path)
    loaded_safetensors = safetensors.torch.load_file(path)
    for loaded in (loaded_torch, loaded_safetensors):
        fresh = TinyMoE().requires_grad_(False)
        fp8mp.convert(fresh, frozen_weights="fp8")
        fresh.load_state_dict(loaded, strict=loaded is loaded_torch)
        for name in ("up.weight", "down.weight", "experts.gate_up_proj"):
            assert torch.equal(bits(state[name]), bits(fresh.state_dict()[name]))
            assert torch.equal(state[name + "_scale_inv"], fresh.state_dict()[name + "_scale_inv"])


def test_a_plain_checkpoint_loads_into_a_converted_model_quantized():
    torch.manual_seed(7)
    source = TinyMoE()
    model = TinyMoE().requires_grad_(False)
    fp8mp.convert(model, frozen_weights="fp8")
    model.load_state_dict(source.state_dict())
    codes, scale_inv = reference_quantize(source.up.weight.detach())
    np.testing.assert_array_equal(bits(model.up.weight.codes).numpy(), codes)
    np.testing.assert_array_equal(model.up.weight.scale_inv.numpy(), scale_inv)
    assert torch.equal(model.embed.weight, source.embed.weight) and type(model.up.weight) is Fp8FrozenWeight


def test_decode_frozen_weights_gives_plain_parameters():
    model = TinyMoE().requires_grad_(False)
    fp8mp.convert(model, frozen_weights="fp8")
    decoded_up = model.up.weight.decode()
    decode_frozen_weights(model)
    assert type(model.up.weight) is torch.nn.Parameter and torch.equal(model.up.weight, decoded_up)
    assert not any(isinstance(p, Fp8FrozenWeight) for p in model.parameters())
    model.up.weight.data.add_(1)  # an ordinary parameter again


def test_deepcopy_compile_and_fp8mp_lora_work_on_a_converted_model():
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).requires_grad_(False)
    fp8mp.convert(model, frozen_weights="fp8")
    twin = copy.deepcopy(model)
    assert type(twin[0].weight) is Fp8FrozenWeight and twin[0].weight.codes.data_ptr() != model[0].weight.codes.data_ptr()
    assert torch.equal(bits(twin[0].weight.codes), bits(model[0].weight.codes))
    x = torch.randn(8, 64)
    torch._dynamo.reset()  # nn.Linear's `forward` is one code object for every test that compiled it: start empty
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)  # inductor may reorder fp32 sums
    with fp8mp.fp8_autocast():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    fp8mp.nn.lora.apply_lora(model, rank=4, alpha=8.0, targets=["0", "2"])
    assert model[0].lora_A.dtype == torch.float32 and type(model[0].base.weight) is Fp8FrozenWeight
    with fp8mp.fp8_autocast():
        model(x).square().sum().backward()
    assert model[0].lora_B.grad.abs().sum() > 0 and model[0].base.weight.grad is None


def test_conv1d_runs_on_the_decoded_weight_and_unconvert_keeps_the_fp8_storage():
    torch.manual_seed(9)
    frozen = fp8mp.nn.Conv1D(32, 64).requires_grad_(False)  # weight [in 64, out 32]
    torch.nn.init.normal_(frozen.weight, std=0.02)
    plain = fp8mp.nn.Conv1D(32, 64).requires_grad_(False)
    store_frozen_weights_in_fp8(frozen)
    plain.load_state_dict({"weight": frozen.weight.decode(), "bias": frozen.bias}, strict=False)
    x = torch.randn(4, 8, 64)
    recipe = fp8mp.recipe.CurrentScaling()
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        assert torch.equal(frozen(x), plain(x))  # the decoded weight casts back to the same codes and scale
    model = torch.nn.Sequential(torch.nn.Linear(64, 32)).requires_grad_(False)
    fp8mp.convert(model, frozen_weights="fp8")
    fp8mp.unconvert(model)
    assert type(model[0]) is torch.nn.Linear and type(model[0].weight) is Fp8FrozenWeight
    state = model.state_dict()
    assert state["0.weight"].dtype == torch.float8_e4m3fn and "0.weight_scale_inv" in state
