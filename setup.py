"""Build fp8mp and its C++/CUDA extension `fp8mp._C`.

FP8MP_CUDA=auto (default) builds the CUDA kernels when torch is a CUDA build
and nvcc is found; FP8MP_CUDA=0 gives a quick CPU-only build; FP8MP_CUDA=1
insists on CUDA and fails loudly without it. TORCH_CUDA_ARCH_LIST defaults to
"8.9;9.0" (Ada and Hopper, the GPUs with FP8 tensor cores).
"""
import glob
import os
import sys

from setuptools import find_packages, setup

# torch looks for CUDA next to the first `nvcc` on PATH; a wrapper script in
# /usr/local/bin would make that /usr/local, so prefer the real toolkit folder.
if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ and os.path.isdir("/usr/local/cuda/bin"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.9;9.0")

import torch  # noqa: E402
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

CSRC = "csrc"


def sources(pattern: str) -> list:
    """csrc/ops.cpp, csrc/py_module.cpp and every op family's folder (csrc/common, csrc/cast, ...)."""
    return sorted(glob.glob(os.path.join(CSRC, pattern)) + glob.glob(os.path.join(CSRC, "*", pattern)))


def is_cuda_source(path: str) -> bool:
    """The CUDA kernels (*.cu) and their torch glue (<family>_cuda.cpp)."""
    return path.endswith(".cu") or path.endswith("_cuda.cpp")


def want_cuda() -> bool:
    mode = os.environ.get("FP8MP_CUDA", "auto").lower()
    if mode not in ("0", "1", "auto"):
        sys.exit(f"FP8MP_CUDA must be 0, 1 or auto, got {mode!r}")
    available = torch.version.cuda is not None and CUDA_HOME is not None
    if mode == "1" and not available:
        sys.exit("FP8MP_CUDA=1 but torch is not a CUDA build or nvcc/CUDA_HOME was not found")
    return mode != "0" and available


def nvidia_wheel_dirs(kind: str) -> list:
    """include/ or lib/ folders of the nvidia-* wheels torch depends on (cuBLASLt lives there)."""
    dirs = []
    for entry in sys.path:
        dirs += glob.glob(os.path.join(entry, "nvidia", "*", kind)) + glob.glob(os.path.join(entry, "nvidia", "*", "*", kind))
    return sorted(set(d for d in dirs if os.path.isdir(d)))


def cublaslt_link_args() -> list:
    """CUDAExtension links cudart and torch only: cuBLASLt must be named explicitly."""
    candidates = [os.path.join(CUDA_HOME, "lib64")] + nvidia_wheel_dirs("lib")
    for lib_dir in candidates:
        libs = sorted(glob.glob(os.path.join(lib_dir, "libcublasLt.so*")))
        if libs:
            return [libs[0], f"-Wl,-rpath,{lib_dir}"]
    sys.exit("cuBLASLt not found: looked in " + ", ".join(candidates))


def extension():
    cpu_sources = [s for s in sources("*.cpp") if not is_cuda_source(s)]
    cxx_flags = ["-O3", "-ffp-contract=off", "-fdiagnostics-color=always"]
    if not want_cuda():
        print("fp8mp: building the CPU-only extension", flush=True)
        return CppExtension("fp8mp._C", cpu_sources, include_dirs=[os.path.abspath(CSRC)],
                            extra_compile_args={"cxx": cxx_flags})
    print(f"fp8mp: building CPU + CUDA kernels for TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}", flush=True)
    cuda_sources = sources("*.cu") + [s for s in sources("*.cpp") if is_cuda_source(s)]
    nvcc_flags = ["-O3", "--fmad=false", "-lineinfo", "--expt-relaxed-constexpr"]
    return CUDAExtension(
        "fp8mp._C",
        cpu_sources + cuda_sources,
        include_dirs=[os.path.abspath(CSRC)] + nvidia_wheel_dirs("include"),
        define_macros=[("FP8MP_WITH_CUDA", "1")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        extra_link_args=cublaslt_link_args(),
    )


setup(
    packages=find_packages(include=["fp8mp", "fp8mp.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
