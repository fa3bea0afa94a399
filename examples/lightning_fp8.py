"""A Lightning script trained in FP8 by fp8mp: the plugin is the only change (the lines marked "fp8mp").

    python examples/lightning_fp8.py                                   # one CPU process, a few seconds
    python examples/lightning_fp8.py --devices 2 --strategy ddp        # 2 CPU processes (gloo)
    python examples/lightning_fp8.py --devices 2 --strategy model_parallel  # FSDP2 (ModelParallelStrategy), 2 CPU processes
    python examples/lightning_fp8.py --import-path lightning           # `import lightning.pytorch` instead

A two-layer MLP learns y = x @ W with `fp8mp.optim.AdamW`; `--out DIR` writes each rank's FP8 scaling state
(amax histories, scales) and loss scaler state to DIR/rank<r>.pt (tests/examples/test_framework_examples.py checks
that the DDP ranks hold the same bits: fp8mp reduces the amaxes over the data-parallel group).
"""
from __future__ import annotations

import argparse
import importlib
import os

import torch

import fp8mp
from fp8mp.integrations.lightning import FP8Precision  # fp8mp


def build_module(L, shard: bool = False):
    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
            self.losses = []

        def configure_model(self):
            if shard:  # ModelParallelStrategy: the model is sharded here, before the plugin could convert it
                fp8mp.convert(self.net)  # fp8mp: convert before fully_shard
                mesh = self.device_mesh["data_parallel"]
                for part in (self.net[0], self.net[2], self.net):
                    torch.distributed.fsdp.fully_shard(part, mesh=mesh)

        def training_step(self, batch, index):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            # FP8 states for the weights; the biases' float32 (under FSDP2 a rank's 32-element shard of a bias cannot
            # hold the FP8 states' 128-element blocks)
            weights = [p for p in self.parameters() if p.dim() == 2]
            biases = [p for p in self.parameters() if p.dim() != 2]
            return fp8mp.optim.AdamW([{"params": weights}, {"params": biases, "state_dtype": torch.float32}], lr=2e-2)

    return Regression()


def data(samples: int = 512) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 32, generator=gen)
    return torch.utils.data.TensorDataset(x, x @ (torch.randn(32, 32, generator=gen) / 32 ** 0.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--import-path", choices=["pytorch_lightning", "lightning"], default="pytorch_lightning")
    parser.add_argument("--out", default=None, help="write each rank's FP8 and loss scaler state here")
    args = parser.parse_args()
    L = importlib.import_module("lightning.pytorch" if args.import_path == "lightning" else "pytorch_lightning")

    torch.manual_seed(0)
    shard = args.strategy == "model_parallel"
    module = build_module(L, shard)
    plugin = FP8Precision()  # fp8mp
    strategy = L.strategies.ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1) if shard \
        else args.strategy
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=args.devices, strategy=strategy,
                        plugins=[plugin],  # fp8mp
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(data(), batch_size=16, shuffle=False))
    rank = trainer.global_rank
    print(f"rank {rank}: loss {module.losses[0]:.4f} -> {module.losses[-1]:.4f} in {len(module.losses)} steps, "
          f"FP8 layers: {sum(isinstance(m, fp8mp.nn.Linear) for m in module.modules())}, "
          f"loss scale {plugin.scaler.get_scale():g}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        fp8_state = {k: v for k, v in module.state_dict().items() if ".fp8_meta." in k}  # buffers: not sharded
        torch.save({"fp8_state": fp8_state, "plugin": plugin.state_dict(), "losses": module.losses},
                   os.path.join(args.out, f"rank{rank}.pt"))


if __name__ == "__main__":
    main()
