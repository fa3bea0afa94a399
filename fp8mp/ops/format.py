"""The two OCP FP8 formats: names, torch dtypes and largest finite values."""
from __future__ import annotations

import torch

# fmt string accepted by the ops -> torch dtype
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# Largest finite magnitude (OCP FP8 spec): E4M3 = 1.75 * 2^8, E5M2 = 1.75 * 2^15.
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
HIGH_PRECISION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def normalize_format(fmt: str) -> str:
    """'E4M3' / 'e4m3' -> 'e4m3'; raises ValueError naming `fmt` for anything else."""
    if not isinstance(fmt, str) or fmt.lower() not in FP8_DTYPES:
        raise ValueError(f"argument 'fmt' must be 'e4m3' or 'e5m2', got {fmt!r}")
    return fmt.lower()



def fp8_max_of(fmt: str) -> float:
    """Largest finite magnitude of format `fmt` ("e4m3" -> 448.0, "e5m2" -> 57344.0, any case)."""
    return FP8_MAX[normalize_format(fmt)]
