"""fp8mp.integrations.lightning.FP8Precision with the real Lightning (both import paths: pytorch_lightning and
lightning.pytorch), its Trainer and Fabric, on CPU.

Each run trains a two-Linear MLP through the framework's own entry point (`Trainer.fit`, or Fabric's setup /
backward / step) and checks: every step's Linear GEMMs ran in FP8 (the fp8mp ops counted), the loss fell, a step
whose FP8 input cast met an Inf was skipped by fp8mp's loss scaler, and a checkpoint written by the framework
(`Trainer`'s at an epoch end, `fabric.save`) resumes into fresh objects with everything bit-exact: the FP8 scaling
buffers (amax, amax history, scales), the loss scaler's state, fp8mp.optim.AdamW's FP8 states, the weights and the
losses after the checkpoint.
"""
from __future__ import annotations

import copy

import pytest
import torch

import framework_helpers as fh
import fp8mp

pl = pytest.importorskip("pytorch_lightning")
lightning = pytest.importorskip("lightning")
import lightning.pytorch  # noqa: E402  (both import paths are loaded before FP8Precision is first looked up)

from fp8mp.integrations.lightning import FP8Precision  # noqa: E402

EPOCH = 6  # batches an epoch: the Trainer's checkpoint is written at the end of epoch 0
STEPS = 2 * EPOCH
INF_STEP = 2  # 0-based step whose batch holds an Inf: FP8 casts saturate it, the scaler must skip the step


def data_with_an_inf():
    data = fh.regression_data(EPOCH)
    data.tensors[0][INF_STEP * fh.BATCH, 0] = float("inf")  # the same batch in every epoch
    return data


def module_class(framework):
    class Regression(framework.LightningModule):
        def __init__(self, seed: int):
            super().__init__()
            self.net = fh.mlp(seed)
            self.losses, self.weights = [], []

        def training_step(self, batch, index):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
            self.losses.append(loss.item())
            return loss

        def on_train_batch_end(self, outputs, batch, index):
            self.weights.append(self.net[0].weight.detach().clone())

        def configure_optimizers(self):
            return fp8mp.optim.AdamW(self.parameters(), lr=2e-2)  # FP8 (E4M3) optimizer states

    return Regression


def make_trainer(framework, plugin, root, callbacks=()):
    return framework.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, plugins=[plugin], logger=False,
                             enable_checkpointing=bool(callbacks), enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, gradient_clip_val=1.0, callbacks=list(callbacks),
                             default_root_dir=str(root))


def loader():
    return torch.utils.data.DataLoader(data_with_an_inf(), batch_size=fh.BATCH)


@pytest.mark.parametrize("path", ["pytorch_lightning", "lightning.pytorch"])
def test_trainer_trains_in_fp8_skips_the_inf_step_and_resumes_bit_exact(tmp_path, path):
    framework = pl if path == "pytorch_lightning" else lightning.pytorch
    Regression = module_class(framework)
    saved = {}

    class KeepStateAtCheckpoint(framework.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, index):
            if trainer.global_step == EPOCH:
                saved.update(fp8=fh.fp8_state(module), plugin=copy.deepcopy(trainer.precision_plugin.state_dict()))

    every_epoch = framework.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=EPOCH, save_top_k=-1)
    plugin = FP8Precision()
    module = Regression(seed=0)
    with fh.Fp8OpCount() as ops:
        make_trainer(framework, plugin, tmp_path, [every_epoch, KeepStateAtCheckpoint()]).fit(module, loader())
    assert isinstance(module.net[0], fp8mp.nn.Linear) and isinstance(module.net[2], fp8mp.nn.Linear)
    assert ops.counts["fp8mp.fp8_gemm"] == STEPS * fh.fp8_gemms_per_step(2)
    assert len(module.losses) == STEPS and module.losses[-1] < 0.6 * module.losses[0]
    # The Inf batch (once an epoch): finite loss (E4M3 saturates), but the step is skipped and the scale backs off.
    assert plugin.scaler.num_skipped_steps == plugin.scaler.num_fp8_skipped_steps == 2
    assert plugin.scaler.get_scale() == 8192.0 / 4
    for step in (INF_STEP, EPOCH + INF_STEP):
        assert torch.equal(module.weights[step], module.weights[step - 1])
        assert not torch.equal(module.weights[step + 1], module.weights[step])

    # Lightning's checkpoint holds the plugin's state and the FP8 buffers; resuming a fresh module from it
    # reproduces the second epoch bit for bit.
    checkpoint = tmp_path / f"epoch=0-step={EPOCH}.ckpt"
    stored = torch.load(checkpoint, weights_only=True)
    assert stored["FP8Precision"]["loss_scaler"]["num_skipped_steps"] == 1
    assert fh.same_bits(stored["FP8Precision"].pop("fp8_state"), saved["fp8"])  # moved out of the model's state_dict
    assert not any(".fp8_meta." in k for k in stored["state_dict"])
    assert fh.same_bits(stored["FP8Precision"], saved["plugin"])
    resumed_plugin, resumed = FP8Precision(), Regression(seed=5)
    make_trainer(framework, resumed_plugin, tmp_path).fit(resumed, loader(), ckpt_path=str(checkpoint))
    assert resumed.losses == module.losses[EPOCH:]
    assert fh.same_bits(resumed.state_dict(), module.state_dict())  # weights and FP8 scaling buffers
    assert fh.same_bits(resumed_plugin.state_dict(), plugin.state_dict())  # loss scaler, fallback policy
    assert fh.same_bits(resumed.trainer.optimizers[0].state_dict(), module.trainer.optimizers[0].state_dict())


def test_fabric_memory_lean_trains_in_fp8_and_resumes_bit_exact(tmp_path):
    fabric_module = lightning.fabric
    batches = list(torch.utils.data.DataLoader(fh.regression_data(STEPS), batch_size=fh.BATCH))

    def setup(seed):
        plugin = FP8Precision(memory_lean=True)
        fabric = fabric_module.Fabric(accelerator="cpu", devices=1, plugins=[plugin])
        net = fh.mlp(seed)
        model, optimizer = fabric.setup(net, fp8mp.optim.AdamW(net.parameters(), lr=2e-2))
        return plugin, fabric, model, optimizer

    def train(fabric, model, optimizer, steps):
        losses = []
        for x, y in steps:
            loss = torch.nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, max_norm=1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    plugin, fabric, model, optimizer = setup(0)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # memory-lean: bf16 parameters
    with fh.Fp8OpCount() as ops:
        losses = train(fabric, model, optimizer, batches[:EPOCH])
    assert ops.counts["fp8mp.fp8_gemm"] == EPOCH * fh.fp8_gemms_per_step(2)
    fabric.save(tmp_path / "fabric.ckpt", {"model": model, "optimizer": optimizer, "fp8": plugin})
    losses += train(fabric, model, optimizer, batches[EPOCH:])
    assert losses[-1] < 0.6 * losses[0]
    assert plugin.scaler.state_dict()["num_steps"] == STEPS

    resumed_plugin, resumed_fabric, resumed_model, resumed_optimizer = setup(5)
    state = {"model": resumed_model, "optimizer": resumed_optimizer, "fp8": resumed_plugin}
    resumed_fabric.load(tmp_path / "fabric.ckpt", state)
    assert resumed_plugin.scaler.state_dict()["num_steps"] == EPOCH
    assert train(resumed_fabric, resumed_model, resumed_optimizer, batches[EPOCH:]) == losses[EPOCH:]
    assert fh.same_bits(resumed_model.state_dict(), model.state_dict())
    assert fh.same_bits(resumed_optimizer.state_dict(), optimizer.state_dict())
    assert fh.same_bits(resumed_plugin.state_dict(), plugin.state_dict())


def test_the_forward_context_is_bf16_autocast_around_fp8_autocast_with_the_recipe():
    recipe = fp8mp.recipe.CurrentScaling()
    plugin = FP8Precision(recipe=recipe)
    plugin.convert_module(fh.mlp())
    with plugin.forward_context():
        assert fp8mp.is_fp8_enabled() and fp8mp.get_fp8_recipe() is recipe
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not fp8mp.is_fp8_enabled() and not torch.is_autocast_enabled("cpu")
    with FP8Precision(memory_lean=True).forward_context():
        assert fp8mp.is_fp8_enabled() and not torch.is_autocast_enabled("cpu")
    with FP8Precision(weights_dtype=torch.bfloat16).module_init_context():
        assert torch.nn.Linear(16, 16).weight.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32


def test_frozen_weights_are_stored_in_fp8_by_convert_module():
    model = fh.mlp()
    model[0].weight.requires_grad_(False)
    FP8Precision(frozen_weights="fp8").convert_module(model)
    assert isinstance(model[0].weight.data, fp8mp.quantized.frozen_weight.Fp8FrozenWeight)
    assert not isinstance(model[2].weight.data, fp8mp.quantized.frozen_weight.Fp8FrozenWeight)  # trainable: as it was


def test_layers_sharded_before_conversion_are_refused_with_the_way_out():
    """ModelParallelStrategy runs configure_model (where the model is sharded) before convert_module: a layer wrapped
    by fully_shard cannot be swapped, and training on in high precision under an FP8 plugin would be silent."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        sharded, converted_first = fh.mlp(), fp8mp.convert(fh.mlp())
        for model in (sharded, converted_first):
            torch.distributed.fsdp.fully_shard(model[0])
        with pytest.raises(ValueError, match=r"\['0'\] were sharded by fully_shard.*fp8mp.convert"):
            FP8Precision().convert_module(sharded)
        FP8Precision(module_filter=lambda name, m: name != "0").convert_module(sharded)  # kept on purpose: fine
        assert isinstance(FP8Precision().convert_module(converted_first)[0], fp8mp.nn.Linear)  # the documented way
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("kwargs, argument", [
    ({"recipe": "delayed"}, "fp8_recipe"), ({"weights_dtype": torch.int8}, "weights_dtype"),
    ({"memory_lean": True, "weights_dtype": torch.float32}, "weights_dtype"), ({"frozen_weights": "int4"}, "frozen_weights"),
    ({"compute_dtype": torch.float64}, "compute_dtype"), ({"loss_scaler": torch.amp.GradScaler("cpu")}, "loss_scaler"),
    ({"fallback": "yes"}, "fallback"), ({"memory_lean": 1}, "memory_lean")])
def test_bad_arguments_are_named(kwargs, argument):
    with pytest.raises((TypeError, ValueError), match=argument):
        FP8Precision(**kwargs)
