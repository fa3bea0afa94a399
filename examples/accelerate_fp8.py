"""An accelerate script trained in FP8 by fp8mp: one added line, two changed (marked "fp8mp").

    python examples/accelerate_fp8.py                       # one CPU process, a few seconds
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_fp8.py  # 2 processes (gloo on a CPU machine)
    torchrun --nproc_per_node 2 examples/accelerate_fp8.py  # the same: accelerate reads torchrun's env

A two-layer MLP learns y = x @ W with `fp8mp.optim.AdamW` under `Accelerator(mixed_precision="bf16")`; halfway the
script saves with `accelerator.save_state` and, with `--resume DIR`, starts from such a folder. `--out DIR` writes each
rank's FP8 scaling state to DIR/rank<r>.pt (tests/examples/test_framework_examples.py compares the ranks).
(`accelerate launch --num_processes 2 --cpu` starts one process: with `--cpu` accelerate 1.15 launches several processes
only through MPI. Its multi-process launcher, `--multi_gpu`, runs on a machine without GPUs too: each process's
Accelerator finds no CUDA and a WORLD_SIZE of 2, and trains on the CPU with gloo.)
"""
from __future__ import annotations

import argparse
import os

import torch
from accelerate import Accelerator

import fp8mp
import fp8mp.integrations.accelerate as fp8_accelerate  # fp8mp


def data(samples: int = 512) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 32, generator=gen)
    return torch.utils.data.TensorDataset(x, x @ (torch.randn(32, 32, generator=gen) / 32 ** 0.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save", default=None, help="accelerator.save_state here after the first epoch")
    parser.add_argument("--resume", default=None, help="accelerator.load_state from here first")
    parser.add_argument("--out", default=None, help="write each rank's FP8 scaling state here")
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    optimizer = fp8mp.optim.AdamW(model.parameters(), lr=2e-2)
    loader = torch.utils.data.DataLoader(data(), batch_size=16)
    model, optimizer, loader = fp8_accelerate.prepare(accelerator, model, optimizer, loader)  # fp8mp
    if args.resume:
        accelerator.load_state(args.resume)

    for epoch in range(args.epochs):
        losses = []
        for x, y in loader:
            with fp8_accelerate.autocast(accelerator):  # fp8mp
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        accelerator.print(f"epoch {epoch}: mean loss {sum(losses) / len(losses):.4f} over {len(losses)} steps, "
                          f"skipped steps {accelerator.scaler.num_skipped_steps}, processes {accelerator.num_processes}")
        if epoch == 0 and args.save:
            accelerator.save_state(args.save)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        fp8_state = {k: v for k, v in accelerator.unwrap_model(model).state_dict().items() if ".fp8_meta." in k}
        torch.save({"fp8_state": fp8_state, "losses": losses}, os.path.join(args.out, f"rank{accelerator.process_index}.pt"))


if __name__ == "__main__":
    main()
