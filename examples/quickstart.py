"""fp8mp quickstart: cast a tensor to FP8 with a scale, read back, and see the error.

Run with `make demo` (or `.venv/bin/python examples/quickstart.py`).
"""
import torch

import fp8mp
from fp8mp.ops.format import FP8_MAX


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(4096, 1024) * 3.0
    print(f"fp8mp {fp8mp.__version__} | torch {torch.__version__} | CUDA kernels: {fp8mp.cuda_kernels_available()}")
    print(f"input: {tuple(x.shape)} float32, max|x| = {x.abs().max().item():.4f}\n")
    print(f"{'format':<6} {'scale':>10} {'amax':>10} {'rel. RMS error':>15} {'saturated':>10}")
    for fmt in ("e4m3", "e5m2"):
        amax = torch.zeros(1)
        scale = torch.ones(1)
        fp8mp.cast_to_fp8(x, scale, amax, fmt)  # first pass only measures amax
        scale = FP8_MAX[fmt] / amax  # current scaling: map max|x| onto the format's max
        y = fp8mp.cast_to_fp8(x, scale, amax, fmt)
        back = fp8mp.cast_from_fp8(y, 1.0 / scale, torch.float32)
        rel_rms = ((back - x).pow(2).mean().sqrt() / x.pow(2).mean().sqrt()).item()
        saturated = (y.float().abs() == FP8_MAX[fmt]).float().mean().item()
        print(f"{fmt:<6} {scale.item():>10.4f} {amax.item():>10.4f} {rel_rms:>15.5f} {saturated:>10.2%}")


if __name__ == "__main__":
    main()
