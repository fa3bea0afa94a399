"""Loads fp8mp's native libraries into torch and says what they can do.

Two plain shared libraries on the LibTorch stable ABI, built by setup.py:
``fp8mp/_C.abi3.so`` (the op schema and the CPU kernels) and, in a CUDA build,
``fp8mp/_cuda_ops.abi3.so`` (the CUDA kernels, cudart + cuBLASLt). They are loaded
with ``torch.ops.load_library``; the CUDA one only when torch itself is a CUDA
build. Before loading, two checks turn what would be an undefined symbol or a
crash into one ImportError naming both versions: torch older than the stable-ABI
version the libraries target, and a CUDA runtime (torch's) of another major version
than the nvcc that compiled the kernels (setup.py records its release).
"""
from __future__ import annotations

import ctypes
import glob
import os
import warnings

import torch

__all__ = ["cuda_kernels_status", "cuda_library_loaded", "cuda_kernels_available", "cpu_library_function", "cpu_isa"]

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the fp8mp package folder


def _library(name: str) -> str | None:
    found = sorted(glob.glob(os.path.join(_HERE, f"{name}*.so")))
    return found[0] if found else None


def _version(text: str) -> tuple[int, ...]:
    """'2.11.0+cu130' -> (2, 11, 0); '13.0' -> (13, 0)."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _build_info():
    try:
        from fp8mp.ops import _build_info
    except ImportError:
        raise ImportError("fp8mp's native libraries are not built: install the wheel (pip install fp8mp-*.whl) "
                          "or build from source (pip install . / python setup.py build_ext --inplace)") from None
    return _build_info


def _check_torch(info) -> None:
    target = ".".join(map(str, info.TORCH_TARGET))
    if _version(torch.__version__)[:2] < tuple(info.TORCH_TARGET):
        raise ImportError(f"fp8mp needs torch >= {target} (its native libraries use the torch {target} stable ABI), "
                          f"but this environment has torch {torch.__version__}")


def _check_cuda(info) -> None:
    """The kernels link the CUDA runtime of the nvcc that compiled them (info.CUDA, its release), whose major
    version must be the one torch loads: another major is another libcudart soname and ABI."""
    built, runtime = info.CUDA, torch.version.cuda
    if _version(built)[:1] != _version(runtime)[:1]:
        raise ImportError(f"fp8mp's CUDA kernels were compiled by nvcc {built} (CUDA {_version(built)[0]}), but this "
                          f"torch uses CUDA {runtime}: install an fp8mp wheel built for CUDA {_version(runtime)[0]}.x, "
                          f"or build fp8mp from source with a CUDA {_version(runtime)[0]}.x toolkit")


def _load() -> bool:
    """Loads the libraries; returns whether the CUDA one is loaded."""
    info = _build_info()
    _check_torch(info)
    cpu_library = _library("_C")
    if cpu_library is None:
        raise ImportError(f"fp8mp's native library _C.abi3.so is missing from {_HERE}: reinstall fp8mp")
    torch.ops.load_library(cpu_library)
    cuda_library = _library("_cuda_ops")
    if cuda_library is None or info.CUDA is None or torch.version.cuda is None:
        return False
    _check_cuda(info)
    torch.ops.load_library(cuda_library)
    return True


_CUDA_LOADED = _load()
_INFO = _build_info()


def cuda_library_loaded() -> bool:
    """True when fp8mp's CUDA kernels are registered with torch (a CUDA build of fp8mp in a CUDA build of torch)."""
    return _CUDA_LOADED


def cuda_kernels_status() -> str:
    """One line on fp8mp's CUDA kernels here: built or not, loaded or not and why, and the device they would run on."""
    if _INFO.CUDA is None:
        return "fp8mp CUDA kernels: not built (CPU-only build of fp8mp); ops run on CPU tensors only"
    built = f"compiled by nvcc {_INFO.CUDA}, archs {_INFO.CUDA_ARCHS}"
    if not _CUDA_LOADED:
        return f"fp8mp CUDA kernels: {built}, not loaded: torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return f"fp8mp CUDA kernels: {built}, loaded; no CUDA device is available"
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    note = "" if (major, minor) >= (8, 9) else " (fp8_gemm needs compute capability >= 8.9)"
    return f"fp8mp CUDA kernels: {built}, loaded; device {name}, compute capability {major}.{minor}{note}"


def cuda_kernels_available() -> bool:
    """True when this build has fp8mp's CUDA kernels, they are loaded and a CUDA device is present
    (cuda_kernels_status() says which is missing)."""
    return _CUDA_LOADED and torch.cuda.is_available()


def cpu_library_function(name: str, restype) -> ctypes._CFuncPtr:
    """The plain C function `name` that _C.abi3.so exports beside its ops (extern "C", no torch types),
    callable through ctypes with return type `restype`."""
    function = getattr(ctypes.CDLL(_library("_C")), name)
    function.restype = restype
    return function


CPU_ISAS = ("avx512", "avx2", "baseline")


def cpu_isa() -> str:
    """The instruction set fp8mp's vectorized CPU loops (casts, norms, optimizer steps) run with in this
    process, decided once (csrc/common/cpu_isa.h): ``"avx512"`` (x86-64-v4), ``"avx2"`` (x86-64-v3: AVX2 and
    FMA) or ``"baseline"`` (any x86-64 CPU), the best this CPU has. The environment variable
    FP8MP_CPU_ISA=avx512|avx2|baseline, read at the first vector loop, asks for a lower one, so that one machine
    runs what an older CPU runs; below avx512 it also keeps the hand-written AVX-512 kernels off (the cast's, and
    the AVX512-BF16 and AMX GEMMs: fp8_gemm then takes its fp32 path). Every level writes the same bits."""
    asked = os.environ.get("FP8MP_CPU_ISA", "")
    if asked and asked not in CPU_ISAS:
        warnings.warn(f"FP8MP_CPU_ISA={asked!r} is not one of {', '.join(CPU_ISAS)}: fp8mp's CPU loops use this "
                      "CPU's best", stacklevel=2)
    return cpu_library_function("fp8mp_cpu_isa", ctypes.c_char_p)().decode()
