"""Benchmark fp8mp.ops.fp8_grouped_gemm (mixture-of-experts GEMMs) against its peers, and a tiny Qwen3-MoE step.

    python benchmarks/bench_grouped_gemm.py                      # CUDA if available, else CPU
    python benchmarks/bench_grouped_gemm.py --device cpu --cases 2048x8x2x1024x512,512x64x8x1024x256
    python benchmarks/bench_grouped_gemm.py --no-model-step --threads 1

A case is TxExKxHxI: T tokens routed top-k among E experts (a fixed random routing, so some experts get more
tokens than others, some maybe none), hidden size H and expert width I. Two GEMMs are timed for each case: the
experts' gate_up projection (x [T*k, H] @ W[e].T, W [E, 2I, H]) and the weight gradient of the down projection
(dW [E, H, I] from dy [T*k, H] and h [T*k, I], grouped along the tokens). Peers, timed in the same run:

* "loop": a Python loop over the experts calling fp8mp.fp8_gemm on each expert's tokens (what a user would
  write without the grouped op); the grouped op is the same kernel per group called from C++;
* "bf16 _grouped_mm": torch._grouped_mm on bf16 operands (transformers' grouped_mm experts implementation), for
  the gate_up projection; for the weight gradient the same op in its 2-D x 2-D form (groups along K).

The fine-grained recipes' token quantization (--token-quantization TxExKxH, default 512x64x8x2048, a
Qwen3-MoE-like shape; "none" skips it) times fp8mp.scaling.block_grouped.quantize_tokens, both layouts of
the [T*k, H] bf16 tokens with the blocks along the tokens kept inside each expert's group, under RowwiseScaling
(one block_quantize per expert for that layout), BlockScaling and MXFP8Scaling (one call on the per-group
zero-padded tokens), against one block_quantize_transpose of the same tokens that ignores the groups.

Ratio columns are (time of the peer) / (time of fp8mp): above 1 means fp8mp is faster. The FP8 operands are
ready-made (no cast timed), as the bf16 peer's are. The model step (--model-step, default on) times one forward
and backward of a tiny Qwen3-MoE built from a config, prepared by fp8mp.integrations.hf.prepare, against the same
model in BF16 with transformers' grouped_mm experts.
"""
from __future__ import annotations

import argparse
import copy

import torch

import fp8mp
from fp8mp.ops import fp8_gemm, fp8_grouped_gemm, fp8_grouped_gemm_wgrad

from timing import cpu_matrix_units, markdown_table, parse_shapes, time_peers, where

DEFAULT_CASES = {"cpu": "2048x8x2x1024x512,1024x64x8x1024x256,512x128x8x512x128",
                 "cuda": "16384x8x2x4096x1024,8192x128x8x4096x768"}


def routed_offsets(tokens: int, experts: int, top_k: int, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    picks = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices.flatten()
    return torch.bincount(picks, minlength=experts).cumsum(0).to(torch.int32).to(device)


def bench_case(T: int, E: int, k: int, H: int, I: int, device: str) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    offs = routed_offsets(T, E, k, device)
    M = T * k
    bounds = [0] + offs.tolist()
    one = torch.ones(1, device=device)
    rows = []

    # gate_up projection: out [M, 2I] = x [M, H] @ W[e].T per expert
    x = torch.randn(M, H, generator=gen).to(device)
    w = (torch.randn(E, 2 * I, H, generator=gen) * 0.05).to(device)
    x8, w8, w_si = x.to(torch.float8_e4m3fn), (w * 16).to(torch.float8_e4m3fn), torch.full((E,), 1 / 16, device=device)
    x16, w16_t = x.bfloat16(), w.bfloat16().transpose(1, 2)  # [E, H, 2I] view: the layout transformers passes

    def loop_fprop():
        out = torch.empty(M, 2 * I, dtype=torch.bfloat16, device=device)
        for e in range(E):
            s, t = bounds[e], bounds[e + 1]
            if t > s:
                out[s:t] = fp8_gemm(x8[s:t], one, w8[e], w_si[e:e + 1], None, torch.bfloat16)
        return out

    peers = {"fp8mp": lambda: fp8_grouped_gemm(x8, one, w8, w_si, offs, None, torch.bfloat16),
             "loop": loop_fprop,
             "bf16 _grouped_mm": lambda: torch._grouped_mm(x16, w16_t, offs=offs)}
    rows.append(dict(case=f"{T}x{E}x{k}x{H}x{I}", gemm=f"gate_up fprop [{M}, {H}] x [{E}, {2 * I}, {H}]",
                     flops=2 * M * H * 2 * I, **{n: s for n, (s, _) in time_peers(peers, device).items()}))

    # down projection's weight gradient: dW [E, H, I] = dy[:, group].T @ h[:, group], grouped along the tokens
    dy_t = torch.randn(H, M, generator=gen).to(device)
    h_t = torch.randn(I, M, generator=gen).to(device)
    dy8, h8 = dy_t.to(torch.float8_e5m2), h_t.to(torch.float8_e4m3fn)
    dy16, h16 = dy_t.bfloat16(), h_t.bfloat16().t()  # [H, M] and [M, I]: _grouped_mm's 2-D x 2-D form

    def loop_wgrad():
        out = torch.empty(E, H, I, dtype=torch.bfloat16, device=device)
        for e in range(E):
            s, t = bounds[e], bounds[e + 1]
            out[e] = fp8_gemm(dy8[:, s:t].contiguous(), one, h8[:, s:t].contiguous(), one, None, torch.bfloat16)
        return out

    peers = {"fp8mp": lambda: fp8_grouped_gemm_wgrad(dy8, one, h8, one, offs, torch.bfloat16),
             "loop": loop_wgrad,
             "bf16 _grouped_mm": lambda: torch._grouped_mm(dy16, h16, offs=offs)}
    rows.append(dict(case=f"{T}x{E}x{k}x{H}x{I}", gemm=f"down wgrad [{H}, {M}] x [{I}, {M}] -> [{E}, {H}, {I}]",
                     flops=2 * M * H * I, **{n: s for n, (s, _) in time_peers(peers, device).items()}))
    return rows


PEERS = ["loop", "bf16 _grouped_mm"]


def gemm_table(rows: list[dict], device: str) -> str:
    headers = ["case TxExKxHxI", "GEMM", "fp8mp ms", "fp8mp TFLOP/s"] + [f"{p} ms" for p in PEERS] + [f"vs {p}" for p in PEERS]
    cells = [[r["case"], r["gemm"], f"{r['fp8mp'] * 1e3:.3f}", f"{r['flops'] / r['fp8mp'] / 1e12:.3f}"]
             + [f"{r[p] * 1e3:.3f}" for p in PEERS] + [f"{r[p] / r['fp8mp']:.2f}x" for p in PEERS] for r in rows]
    return markdown_table(f"fp8_grouped_gemm (FP8 -> bf16), {where(device)}", headers, cells)


def qwen3_moe_step(device: str) -> tuple[dict, str]:
    """One training step (forward and backward) of a tiny Qwen3-MoE in bf16 weights, as callables: "fp8mp" for
    the model prepared by fp8mp.integrations.hf.prepare, "bf16" for the same weights with transformers'
    grouped_mm experts; and the model's description."""
    import transformers

    import fp8mp.integrations.hf as fp8_hf

    config = transformers.Qwen3MoeConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024,
                                         moe_intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                                         num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
                                         decoder_sparse_step=1, mlp_only_layers=[])
    torch.manual_seed(0)
    bf16 = transformers.AutoModelForCausalLM.from_config(config).to(device=device, dtype=torch.bfloat16)
    fp8 = fp8_hf.prepare(copy.deepcopy(bf16))
    ids = torch.randint(0, config.vocab_size, (4, 256), generator=torch.Generator().manual_seed(2)).to(device)

    def step(model):
        def run():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
        return run

    return {"fp8mp": step(fp8), "bf16": step(bf16)}, "H 512, 32 experts top-4, I 256, 2 layers, 4x256 tokens"


def model_step_table(device: str) -> str:
    steps, model = qwen3_moe_step(device)
    timed = time_peers(steps, device)
    fp8_s, bf16_s = timed["fp8mp"][0], timed["bf16"][0]
    return markdown_table(f"Qwen3-MoE step ({model}), {where(device)}",
                          ["FP8 (fp8mp) ms", "BF16 (grouped_mm) ms", "BF16 / FP8"],
                          [[f"{fp8_s * 1e3:.1f}", f"{bf16_s * 1e3:.1f}", f"{bf16_s / fp8_s:.2f}x"]])


def token_quantization_table(T: int, E: int, k: int, H: int, device: str) -> str:
    from fp8mp.scaling.block_grouped import quantize_tokens
    from fp8mp.scaling.recipe_registry import quantizer_for
    from fp8mp.ops import block_quantize_transpose
    from fp8mp.recipe import BlockScaling, MXFP8Scaling, RowwiseScaling

    ends = [0] + routed_offsets(T, E, k, "cpu").tolist()
    sizes = [end - start for start, end in zip(ends, ends[1:])]
    x = torch.randn(T * k, H, generator=torch.Generator().manual_seed(3)).bfloat16().to(device)
    recipes = {"rowwise": RowwiseScaling(), "block 1x128": BlockScaling(), "mxfp8 1x32": MXFP8Scaling()}
    peers = {name: (lambda q=quantizer_for(r): quantize_tokens(x, sizes, q, "e4m3")) for name, r in recipes.items()}
    peers["ungrouped"] = lambda: block_quantize_transpose(x, H, T * k, "e4m3", "pow2")
    timed = time_peers(peers, device, rounds=3)
    base = timed["ungrouped"][0]
    return markdown_table(f"token quantization per group, {T}x{E}x{k}x{H} (TxExKxH), {where(device)}",
                          ["recipe", "ms", "ungrouped block_quantize_transpose ms", "vs ungrouped"],
                          [[name, f"{timed[name][0] * 1e3:.2f}", f"{base * 1e3:.2f}", f"{base / timed[name][0]:.2f}x"]
                           for name in recipes])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if fp8mp.cuda_kernels_available() else "cpu")
    parser.add_argument("--cases", default=None, help="comma-separated TxExKxHxI (default depends on device)")
    parser.add_argument("--no-model-step", action="store_true", help="skip the Qwen3-MoE step")
    parser.add_argument("--token-quantization", default="512x64x8x2048",
                        help="TxExKxH of the fine-grained token quantization table, or 'none'")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for every peer (torch.set_num_threads); on a busy host 1 keeps the "
                             "peers' parallel regions from waiting on descheduled threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        parser.error("--device cuda needs a CUDA device and fp8mp built with its CUDA kernels")
    if args.device == "cpu":
        print(cpu_matrix_units())
    rows = [row for case in parse_shapes(args.cases or DEFAULT_CASES[args.device]) for row in bench_case(*case, args.device)]
    print(gemm_table(rows, args.device))
    print("ratio = peer time / fp8mp time (> 1: fp8mp faster)")
    if args.token_quantization != "none":
        print(token_quantization_table(*parse_shapes(args.token_quantization)[0], args.device))
    if not args.no_model_step:
        print(model_step_table(args.device))


if __name__ == "__main__":
    main()
