"""How fast a layer's GEMMs run at its shape, under each candidate and in high precision, on this device.

One layer's forward and backward (the three GEMMs, quantization included: the candidate's whole FP8 path through
an fp8mp module) are timed at its shape (M tokens, K in, N out) on random data: the median of `repeats` runs after
one warm-up, forward and backward separately, CUDA synchronized around each. High precision ("bf16") is the same
layer as a torch.nn.Linear in the dtype the layer computes in (its input's dtype: bf16 where the model runs in
bf16, fp32 for an fp32 model on CPU). A Conv1D is timed as a Linear of its shape.

Times are cached per (device, dtype, shape, candidate recipe) for the life of the process, and in a JSON file
when given one (`cache_file`): a second plan of the same shapes measures nothing, and a cache file pins the
times, so that the plan repeats exactly (timings are the one part of a plan that varies between runs).
"""
from __future__ import annotations

import json
import os
import statistics
import time

import torch

from fp8mp.planning.layers import PlannedLayer, fp8_probe
from fp8mp.scaling.autocast import fp8_autocast
from fp8mp.utils.device import device_label, synchronize

__all__ = ["cache_key", "layer_times", "clear_cache", "HIGH_PRECISION_KEY"]

HIGH_PRECISION_KEY = "bf16"
_CACHE: dict[str, dict[str, float]] = {}


def clear_cache() -> None:
    """Forget the times measured in this process."""
    _CACHE.clear()


def cache_key(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int, candidate) -> str:
    """The cache's key of a shape (M x K x N) under `candidate` (a recipe, or None: high precision) on `device`."""
    what = "high precision" if candidate is None else repr(candidate)
    return f"{device_label(device)} | {str(dtype).removeprefix('torch.')} | {m}x{k}x{n} | {what}"


def _time_module(module: torch.nn.Module, x: torch.Tensor, g: torch.Tensor, recipe, repeats: int) -> dict[str, float]:
    """Median forward and backward milliseconds of `module` on x with output gradient g (FP8 under `recipe`)."""
    device = x.device
    forward, backward = [], []
    for run in range(repeats + 1):  # run 0 warms up
        xi = x.detach().requires_grad_(True)
        synchronize(device)
        start = time.perf_counter()
        with fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
            y = module(xi)
        synchronize(device)
        middle = time.perf_counter()
        y.backward(g)
        synchronize(device)
        end = time.perf_counter()
        if run:
            forward.append(1e3 * (middle - start))
            backward.append(1e3 * (end - middle))
    return {"forward": statistics.median(forward), "backward": statistics.median(backward)}


def _load(cache_file) -> dict:
    if cache_file is None or not os.path.exists(cache_file):
        return {}
    with open(cache_file) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"argument 'speed_cache': {os.fspath(cache_file)} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"argument 'speed_cache': {os.fspath(cache_file)} must hold a JSON object")
    return data


def _checked(entry, key: str, cache_file) -> dict[str, float] | None:
    if entry is None:
        return None
    if not isinstance(entry, dict) or not all(isinstance(entry.get(part), (int, float)) and entry[part] >= 0
                                              for part in ("forward", "backward")):
        raise ValueError(f"argument 'speed_cache': {os.fspath(cache_file)}: entry {key!r} must be "
                         f'{{"forward": ms, "backward": ms}} with numbers >= 0, got {entry!r}')
    return entry


def layer_times(layer: PlannedLayer, tokens: int, dtype: torch.dtype, candidates: dict[str, object],
                repeats: int = 5, cache_file: str | os.PathLike | None = None) -> dict[str, dict[str, float]]:
    """candidate name (and "bf16") -> {"forward": ms, "backward": ms} of `layer` at `tokens` rows (module
    docstring). Measures only what neither the process cache nor `cache_file` holds, and writes new times back
    to `cache_file`."""
    device = layer.module.weight.device
    k, n = layer.in_features, layer.out_features
    stored = _load(cache_file)
    wanted = {HIGH_PRECISION_KEY: None, **candidates}
    times, new = {}, False
    generator = torch.Generator(device="cpu").manual_seed(0)
    data = None
    for name, recipe in wanted.items():
        key = cache_key(device, dtype, tokens, k, n, recipe)
        found = _CACHE.get(key) or _checked(stored.get(key), key, cache_file)
        if found is None:
            if data is None:
                x = torch.randn(tokens, k, generator=generator).to(device=device, dtype=dtype)
                g = torch.randn(tokens, n, generator=generator).to(device=device, dtype=dtype)
                linear = torch.nn.Linear(k, n, device=device, dtype=dtype)
                data = (x, g, linear)
            x, g, linear = data
            shell = PlannedLayer(layer.name, linear, k, n, weight_in_out=False)
            module = linear if recipe is None else fp8_probe(shell, recipe)
            found = _time_module(module, x, g, recipe, repeats)
            new = True
        _CACHE[key] = found
        stored[key] = found
        times[name] = dict(found)
    if new and cache_file is not None:
        with open(cache_file, "w") as f:
            json.dump(stored, f, indent=1, sort_keys=True)
            f.write("\n")
    return times
