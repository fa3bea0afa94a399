"""fp8mp in torchtitan 0.3 (pinned in requirements-frameworks.txt) through torchtitan's own pieces: the Llama3 debug
model from its model registry, the `--override.imports` registry that swaps its Linear configs, its meta-device build
and `init_weights`, its optimizer and LR-scheduler containers and its DCP CheckpointManager.

torchtitan's Trainer needs an accelerator (it picks "cuda" when none is found), and the debug model's attention
backends (flex, varlen) have no CPU backward: the test swaps the inner attention for torchtitan's
ScaledDotProductAttention and runs the Trainer's steps (forward, loss, backward, clip, optimizer and scheduler
step, checkpoint save and load) itself."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.config.override import OverrideConfig, apply_overrides, parse_cli_imports
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
from torchtitan.models.common.linear import Linear as TitanLinear, ScaledBiasRowwiseLinear
from torchtitan.models.llama3 import model_registry

import fp8mp
from fp8mp.integrations import torchtitan as fp8_titan
import framework_helpers as fh

OPTION = "fp8mp.integrations.torchtitan.fp8_linear"
VOCAB, USED, BATCH, SEQ = 2048, 64, 4, 32
STEPS, SAVED_AT = 4, 2
LINEARS = 6 * 5 + 1  # per block wqkv, wo, w1, w2, w3; and the LM head


class TrainState:
    """The step counter torchtitan's checkpointer saves beside the model (the Trainer itself is that state there)."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state):
        self.step = int(state["step"])


def debug_model_config(imports=(OPTION,)):
    """torchtitan's Llama3 debug model config, attention on SDPA (CPU backward), with the override applied."""
    spec = model_registry("debugmodel")
    for _fqn, _cfg, parent, attr in list(spec.model.traverse(FlexAttention.Config)):
        setattr(parent, attr, ScaledDotProductAttention.Config())
    apply_overrides(OverrideConfig(imports=parse_cli_imports(list(imports))), spec)
    return spec.model


def build(config, seed: int):
    """As torchtitan's Trainer builds a model: on the meta device, moved with to_empty, then init_weights."""
    with torch.device("meta"):
        model = copy.deepcopy(config).build()
    model.verify_module_protocol()
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model.train()


def batches(n: int, seed: int = 1):
    """Walks over the first USED tokens stepping up by 1, 2 or 3: the loss falls fast from about ln(2048) = 7.6
    (first towards ln(USED) = 4.2, the tokens in use, then towards ln(3) = 1.1)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, USED, (n, BATCH, 1), generator=gen)
    walks = (start + torch.randint(1, 4, (n, BATCH, SEQ), generator=gen).cumsum(-1)) % USED
    return torch.cat([start, walks], -1)


def parts(model, tmp_path):
    optimizers = default_adamw(lr=3e-3).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=STEPS)
    state = TrainState()
    checkpointer = CheckpointManager.Config(enable=True, folder="checkpoint", interval=1).build(
        dataloader=None, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
        states={"train_state": state}, sd_adapter=None, base_folder=str(tmp_path))
    return optimizers, schedulers, state, checkpointer


def train_step(model, optimizers, schedulers, state, tokens) -> float:
    """What torchtitan's Trainer.train_step does with one microbatch and no parallelism."""
    optimizers.zero_grad()
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizers.step()
    schedulers.step()
    state.step += 1
    return loss.item()


def test_the_override_swaps_exactly_the_torchtitan_linears_with_fp8_dims():
    plain, swapped = debug_model_config(imports=()), debug_model_config()
    plain_linears = [c for _, c, _, _ in plain.traverse(TitanLinear.Config)]
    fp8_linears = [c for _, c, _, _ in swapped.traverse(fp8_titan.Linear.Config)]
    assert len(plain_linears) == len(fp8_linears) == LINEARS
    assert [(c.in_features, c.out_features) for c in fp8_linears] == [(c.in_features, c.out_features) for c in plain_linears]
    # subclasses (a forward of their own) and dims that are not multiples of 16 stay
    for config in (ScaledBiasRowwiseLinear.Config(in_features=32, out_features=48),
                   TitanLinear.Config(in_features=24, out_features=32)):
        assert fp8_titan.fp8_linear(config) is config
    assert fp8_titan.fp8_linear(TitanLinear.Config(in_features=32, out_features=48), recipe="current").recipe == "current"
    with pytest.raises(ValueError, match="argument 'recipe'"):
        fp8_titan.fp8_linear(TitanLinear.Config(in_features=32, out_features=48), recipe="e5m2")
    # the option's JSON form carries the recipe to every layer, and the converter form does the same swap
    current = debug_model_config(imports=(OPTION + '={"recipe": "current"}',))
    assert {c.recipe for _, c, _, _ in current.traverse(fp8_titan.Linear.Config)} == {"current"}
    converted = fp8_titan.Fp8LinearConverter.Config().build().convert(debug_model_config(imports=()))
    assert len(list(converted.traverse(fp8_titan.Linear.Config))) == LINEARS


@pytest.fixture
def one_rank():
    """A one-rank gloo process group, as torchtitan always runs under torch.distributed (its DCP load needs one)."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def test_debug_model_trains_in_fp8_and_a_dcp_checkpoint_resumes_bit_exact(tmp_path, one_rank):
    data = batches(STEPS)
    config = debug_model_config()
    model = build(config, seed=0)
    fp8_layers = [m for m in model.modules() if isinstance(m, fp8mp.nn.Linear)]
    assert len(fp8_layers) == LINEARS and all(isinstance(m, fp8_titan.Linear) for m in fp8_layers)
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())
    # init_states reset the FP8 buffers that to_empty left as garbage
    assert all(torch.equal(m.fp8_meta.scale, torch.ones(3)) and not m.fp8_meta.initialized.item() for m in fp8_layers)
    optimizers, schedulers, state, checkpointer = parts(model, tmp_path / "run")
    losses, saved = [], {}
    with fh.Fp8OpCount() as ops:
        for step in range(STEPS):
            losses.append(train_step(model, optimizers, schedulers, state, data[step]))
            if state.step == SAVED_AT:
                checkpointer.save(curr_step=state.step)
                saved = {"fp8": fh.fp8_state(model), "weights": copy.deepcopy(model.state_dict())}
    checkpointer.close()
    # every Linear ran its three GEMMs in FP8 (the first layer's input gradient too: its input is an activation)
    assert ops.counts["fp8mp.fp8_gemm"] == STEPS * 3 * LINEARS
    assert all(math.isfinite(x) for x in losses) and losses[0] > 7.0 and losses[-1] < losses[0] - 0.5, losses
    assert all(m.fp8_meta.initialized.item() for m in fp8_layers)
    final = {"fp8": fh.fp8_state(model), "weights": copy.deepcopy(model.state_dict())}

    # A fresh model (other init seed), fresh optimizer and scheduler, loaded by torchtitan's checkpointer
    resumed = build(config, seed=7)
    optimizers, schedulers, state, checkpointer = parts(resumed, tmp_path / "run")
    assert checkpointer.load(step=SAVED_AT) and state.step == SAVED_AT
    assert fh.same_bits(fh.fp8_state(resumed), saved["fp8"])
    assert fh.same_bits(dict(resumed.state_dict()), saved["weights"])
    resumed_losses = [train_step(resumed, optimizers, schedulers, state, data[step]) for step in range(SAVED_AT, STEPS)]
    checkpointer.close()
    assert resumed_losses == losses[SAVED_AT:]
    assert fh.same_bits(fh.fp8_state(resumed), final["fp8"])
    assert fh.same_bits(dict(resumed.state_dict()), final["weights"])
