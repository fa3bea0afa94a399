"""Build fp8mp and its two native libraries, both on the LibTorch stable ABI.

  fp8mp/_C.abi3.so         the op schema and the CPU kernels (no CUDA dependency)
  fp8mp/_cuda_ops.abi3.so  the CUDA kernels (cudart + cuBLASLt), built when CUDA is wanted

Both are plain shared libraries loaded with torch.ops.load_library (fp8mp/ops/native.py):
no Python module and no pybind, so one wheel (cp310-abi3) serves every CPython >= 3.10, and
TORCH_TARGET_VERSION = 2.11 keeps them to the stable API of torch 2.11, so the same files
load in every torch from 2.11 on (csrc/STABLE_ABI.md).

FP8MP_CUDA=auto (default) builds the CUDA library when torch is a CUDA build and nvcc is
found; FP8MP_CUDA=0 gives a quick CPU-only build; FP8MP_CUDA=1 insists on CUDA and fails
loudly without it. TORCH_CUDA_ARCH_LIST defaults to "8.9;9.0;10.0;12.0+PTX" (Ada, Hopper,
Blackwell datacenter and consumer, the GPUs with FP8 tensor cores, plus PTX for newer ones).
"""
import glob
import os
import re
import subprocess
import sys

from setuptools import find_packages, setup

# torch looks for CUDA next to the first `nvcc` on PATH; a wrapper script in
# /usr/local/bin would make that /usr/local, so prefer the real toolkit folder.
if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ and os.path.isdir("/usr/local/cuda/bin"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"
DEFAULT_CUDA_ARCHS = "8.9;9.0;10.0;12.0+PTX"
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)

import torch  # noqa: E402
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

CSRC = "csrc"
TORCH_TARGET = (2, 11)  # the oldest torch whose stable ABI the libraries use
TORCH_TARGET_VERSION = f"0x{TORCH_TARGET[0]:02x}{TORCH_TARGET[1]:02x}000000000000"
MIN_PYTHON_ABI = "cp310"
BUILD_INFO = os.path.join("fp8mp", "ops", "_build_info.py")


def sources(pattern: str) -> list:
    """csrc/ops.cpp and every op family's folder (csrc/common, csrc/cast, ...)."""
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


def cublaslt_include_dirs() -> list:
    """CUDA's own include folder, then, only where it lacks cublasLt.h, the one nvidia-* wheel folder that
    has it: every nvidia/*/include ahead of CUDA's own would shadow the toolkit's cuda_runtime.h."""
    cuda_include = os.path.join(CUDA_HOME, "include")
    if os.path.isfile(os.path.join(cuda_include, "cublasLt.h")):
        return [cuda_include]
    for folder in nvidia_wheel_dirs("include"):
        if os.path.isfile(os.path.join(folder, "cublasLt.h")):
            return [cuda_include, folder]
    sys.exit(f"cublasLt.h not found in {cuda_include} nor in the nvidia-* wheels' include folders")


def cublaslt_library() -> str:
    """CUDAExtension links cudart only: cuBLASLt is named explicitly (found at run time by its soname,
    which torch's CUDA build has already loaded)."""
    candidates = [os.path.join(CUDA_HOME, "lib64")] + nvidia_wheel_dirs("lib")
    for lib_dir in candidates:
        libs = sorted(glob.glob(os.path.join(lib_dir, "libcublasLt.so*")))
        if libs:
            return libs[0]
    sys.exit("cuBLASLt not found: looked in " + ", ".join(candidates))


COMMON = dict(
    define_macros=[("TORCH_TARGET_VERSION", TORCH_TARGET_VERSION), ("Py_LIMITED_API", "0x030A0000")],
    py_limited_api=True,
)
# -fno-math-errno: nothing reads errno, and a sqrt that may set it keeps a loop from vectorizing (csrc/optim).
CXX_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden", "-fdiagnostics-color=always"]
LINK_STRIP = ["-Wl,--strip-all", "-Wl,--as-needed"]


def stable_abi_only(ext, extra_libraries=()):
    """Link only what the stable ABI needs: libtorch_cpu exports the C shim (torch_*, aoti_torch_*),
    libtorch_cuda its CUDA part; libc10 / libtorch / libtorch_python, which cpp_extension adds, hold no
    symbol these libraries use."""
    ext.libraries = ["torch_cpu", *extra_libraries]
    return ext


def cpu_extension():
    cpu_sources = [s for s in sources("*.cpp") if not is_cuda_source(s)]
    return stable_abi_only(CppExtension("fp8mp._C", cpu_sources, include_dirs=[os.path.abspath(CSRC)],
                                        extra_compile_args={"cxx": CXX_FLAGS}, extra_link_args=LINK_STRIP, **COMMON))


def arch_lists(arch_list: str) -> tuple[str, str]:
    """TORCH_CUDA_ARCH_LIST ("8.9;9.0;10.0;12.0+PTX") -> the cubin archs and the PTX archs as "89_90_100_120"
    and "120": what csrc/common/device_support.h checks a GPU against at run time (one preprocessor token each,
    which csrc/common/cuda_check.cu turns into a string: nvcc would split a -D value at commas)."""
    cubins, ptx = [], []
    for entry in arch_list.replace(",", ";").replace(" ", ";").split(";"):
        if not entry:
            continue
        number = "".join(c for c in entry.split("+")[0] if c.isdigit() or c == ".")
        if "." not in number:
            continue
        major, minor = number.split(".")[:2]
        arch = str(int(major) * 10 + int(minor or 0))
        cubins.append(arch)
        if entry.upper().endswith("+PTX"):
            ptx.append(arch)
    return "_".join(cubins), "_".join(ptx)


def nvcc_version() -> str:
    """The release of the nvcc that compiles the CUDA kernels ("13.0"), from `nvcc --version`."""
    out = subprocess.run([os.path.join(CUDA_HOME, "bin", "nvcc"), "--version"], capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"release (\d+\.\d+)", out)
    if found is None:
        sys.exit(f"could not read the CUDA release from nvcc --version:\n{out}")
    return found.group(1)


def cuda_extension():
    # The CUDA library carries its own copy of the argument checks, so it needs nothing from _C but the schema.
    checks = sources("*_checks.cpp")  # common/op_checks.cpp and each family's
    cuda_sources = sources("*.cu") + [s for s in sources("*.cpp") if is_cuda_source(s)] + checks
    nvcc_flags = ["-O3", "--fmad=false", "-lineinfo", "--expt-relaxed-constexpr", "-Xcompiler", "-fvisibility=hidden"]
    cubins, ptx = arch_lists(os.environ["TORCH_CUDA_ARCH_LIST"])
    defines = ["-DUSE_CUDA", f"-DFP8MP_CUBIN_ARCHS={cubins}", f"-DFP8MP_PTX_ARCHS={ptx}"]
    ext = CUDAExtension(
        "fp8mp._cuda_ops",
        cuda_sources,
        include_dirs=[os.path.abspath(CSRC)] + cublaslt_include_dirs(),
        extra_compile_args={"cxx": CXX_FLAGS + defines, "nvcc": nvcc_flags + defines},
        extra_link_args=LINK_STRIP + [cublaslt_library()],
        **COMMON,
    )
    return stable_abi_only(ext, ["torch_cuda", "cudart"])  # libtorch_cuda: the CUDA part of the shim (current stream)


def write_build_info(cuda: bool) -> None:
    """fp8mp/ops/_build_info.py: what fp8mp/ops/native.py checks at import (generated, not in git). CUDA is the
    release of the nvcc that compiled the kernels (the CUDA runtime they need), not torch's at build time."""
    archs = os.environ["TORCH_CUDA_ARCH_LIST"] if cuda else ""
    with open(BUILD_INFO, "w") as f:
        f.write('"""Written by setup.py at build time: what the native libraries were built for."""\n')
        f.write(f"TORCH_TARGET = {TORCH_TARGET!r}\n")
        f.write(f"BUILT_WITH_TORCH = {torch.__version__.split('+')[0]!r}\n")
        f.write(f"CUDA = {nvcc_version() if cuda else None!r}\n")
        f.write(f"BUILT_WITH_TORCH_CUDA = {torch.version.cuda if cuda else None!r}\n")
        f.write(f"CUDA_ARCHS = {archs!r}\n")


def extensions():
    cuda = want_cuda()
    write_build_info(cuda)
    if not cuda:
        print("fp8mp: building the CPU library only", flush=True)
        return [cpu_extension()]
    print(f"fp8mp: building the CPU and CUDA libraries, TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}",
          flush=True)
    return [cpu_extension(), cuda_extension()]


setup(
    packages=find_packages(include=["fp8mp", "fp8mp.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": MIN_PYTHON_ABI}},
)
