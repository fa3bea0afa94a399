"""What the build promises: native libraries on the LibTorch stable ABI only, CUDA code for every
FP8 GPU generation, the CUDA kernels registered, and package metadata that pins no torch."""
from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import shutil
import subprocess

import pytest
import torch

import fp8mp
from fp8mp.ops import _build_info

PACKAGE = os.path.dirname(os.path.abspath(fp8mp.__file__))


def find_cuobjdump() -> str:
    """The CUDA toolkit's cuobjdump, or the copy triton (a dependency of CUDA builds of torch) ships."""
    candidates = [shutil.which("cuobjdump") or "", "/usr/local/cuda/bin/cuobjdump"]
    try:
        import triton
        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except ImportError:
        pass
    return next((c for c in candidates if c and os.path.exists(c)), "cuobjdump")


CUOBJDUMP = find_cuobjdump()
# The released wheel's TORCH_CUDA_ARCH_LIST: Ada, Hopper, Blackwell (datacenter, consumer), PTX for newer GPUs.
RELEASE_CUDA_ARCHS = "8.9;9.0;10.0;12.0+PTX"
SOURCE_TREE = os.path.dirname(PACKAGE)
# The schema: csrc/ops.cpp beside these tests (the source tree, or the copy make test's wheel venvs run them from).
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", "ops.cpp")


def declared_ops() -> list[str]:
    """The op names csrc/ops.cpp declares, m.def("name(...) -> ...") by m.def, in its order."""
    with open(SCHEMA_FILE) as f:
        return re.findall(r'm\.def\(\s*"(\w+)\(', f.read())


def registered_ops() -> list[str]:
    """The ops of the fp8mp namespace in torch's dispatcher: what the loaded library declared."""
    return sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("fp8mp::"))


# Every op of the schema (from the dispatcher where no schema file is at hand), so that a new op cannot be left out.
ALL_OPS = declared_ops() if os.path.exists(SCHEMA_FILE) else registered_ops()
CPU_ONLY_OPS = ["norm_fwd_block_fp8"]  # no CUDA kernel: fp8mp/ops/norm.py refuses CUDA tensors with NotImplementedError
OPS = [op for op in ALL_OPS if op not in CPU_ONLY_OPS]
needs_cuda_build = pytest.mark.skipif(_build_info.CUDA is None, reason="CPU-only build of fp8mp: no CUDA library")


def libraries() -> list[str]:
    return sorted(glob.glob(os.path.join(PACKAGE, "_C*.so")) + glob.glob(os.path.join(PACKAGE, "_cuda_ops*.so")))


def test_the_libraries_are_abi3_and_target_torch_2_11():
    names = [os.path.basename(p) for p in libraries()]
    assert "_C.abi3.so" in names, names
    assert all(n.endswith(".abi3.so") for n in names), names
    assert tuple(_build_info.TORCH_TARGET) == (2, 11)


# A C++ name in one of torch's namespaces, demangled: every nested name (plain, const or volatile member
# functions: _ZN, _ZNK, _ZNV), every template argument and every parameter type shows its namespace there.
TORCH_CPP_NAMESPACE = re.compile(r"(?<![\w:])(c10|at|torch|caffe2)::")


def torch_cpp_symbols(symbols: list[str]) -> list[str]:
    """The symbols among `symbols` (mangled) that name something of torch's C++ ABI, demangled by c++filt."""
    demangled = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True,
                               check=True).stdout.splitlines()
    return [d for d in demangled if TORCH_CPP_NAMESPACE.search(d)]


needs_binutils = pytest.mark.skipif(shutil.which("nm") is None or shutil.which("c++filt") is None,
                                    reason="needs binutils' nm and c++filt")


@needs_binutils
def test_the_torch_cpp_symbol_check_sees_every_kind_of_name():
    caught = ["_ZN2at6TensorD1Ev", "_ZNK2at10TensorBase4sizeEl", "_ZNK3c1010TensorImpl5sizesEv",
              "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs", "_ZNV3c106Device5indexEv",
              "_ZN6caffe28TypeMeta21_typeMetaDataInstanceIfEEPKNS_6detail12TypeMetaDataEv",
              "_ZN5torch8autograd8VariableC1Ev", "_Z3fooRKN2at6TensorE", "_ZNSt6vectorIN2at6TensorESaIS1_EED1Ev"]
    kept = ["aoti_torch_empty_strided", "torch_call_dispatcher", "sgemm_", "_ZNSt6vectorIiSaIiEED1Ev",
            "_ZN5fp8mp3cpu12cpu_featuresEv", "_ZTVN10__cxxabiv117__class_type_infoE"]
    assert len(torch_cpp_symbols(caught)) == len(caught)
    assert torch_cpp_symbols(kept) == []


@needs_binutils
@pytest.mark.parametrize("library", libraries(), ids=os.path.basename)
def test_the_libraries_use_only_the_stable_c_shim_of_torch(library):
    undefined = subprocess.run(["nm", "-D", "--undefined-only", library], capture_output=True, text=True,
                               check=True).stdout.split()
    symbols = [s.split("@")[0] for s in undefined if s not in ("U", "w", "v")]
    torch_cpp = torch_cpp_symbols(symbols)
    assert not torch_cpp, f"{library} links torch's C++ ABI: {torch_cpp[:5]}"
    assert any(s.startswith(("aoti_torch_", "torch_")) for s in symbols)


def archs_of(arch_list: str) -> tuple[list[str], list[str]]:
    """'8.9;9.0+PTX' -> (['sm_89', 'sm_90'], ['sm_90']): the machine code and the PTX a TORCH_CUDA_ARCH_LIST asks for."""
    elf, ptx = [], []
    for arch in filter(None, re.split(r"[;\s]+", arch_list)):
        sm = "sm_" + arch.replace("+PTX", "").replace(".", "")
        elf.append(sm)
        if arch.endswith("+PTX"):
            ptx.append(sm)
    return elf, ptx


def test_archs_of_reads_an_arch_list():
    assert archs_of(RELEASE_CUDA_ARCHS) == (["sm_89", "sm_90", "sm_100", "sm_120"], ["sm_120"])
    assert archs_of("9.0") == (["sm_90"], [])


@needs_cuda_build
@pytest.mark.skipif(not os.path.exists(CUOBJDUMP), reason="needs the CUDA toolkit's cuobjdump")
def test_the_cuda_library_holds_code_for_the_archs_it_was_built_for():
    """The archs setup.py recorded (fp8mp/ops/_build_info.py): the release's four and PTX, or the GPU check's 9.0."""
    cuda_library = glob.glob(os.path.join(PACKAGE, "_cuda_ops*.so"))[0]
    elf = subprocess.run([CUOBJDUMP, "--list-elf", cuda_library], capture_output=True, text=True, check=True).stdout
    ptx = subprocess.run([CUOBJDUMP, "--list-ptx", cuda_library], capture_output=True, text=True).stdout
    wanted_elf, wanted_ptx = archs_of(_build_info.CUDA_ARCHS)
    assert wanted_elf, f"no arch recorded in {_build_info.__file__}"
    for arch in wanted_elf:
        assert f".{arch}." in elf, f"no {arch} code in {cuda_library}:\n{elf}"
    for arch in wanted_ptx:
        assert arch in ptx, f"no {arch} PTX for newer GPUs in {cuda_library}:\n{ptx}"
    built = {m for m in re.findall(r"\.(sm_\d+a?)\.", elf)}
    assert built <= set(wanted_elf), f"code for {sorted(built - set(wanted_elf))}, not in {_build_info.CUDA_ARCHS!r}"


@pytest.mark.skipif(not os.path.exists(os.path.join(SOURCE_TREE, "setup.py")), reason="needs the source tree")
def test_the_release_builds_for_every_fp8_gpu_and_ptx():
    """What `make wheel` and `pip install .` build unless TORCH_CUDA_ARCH_LIST says otherwise."""
    with open(os.path.join(SOURCE_TREE, "setup.py")) as f:
        setup_py = f.read()
    with open(os.path.join(SOURCE_TREE, "Makefile")) as f:
        makefile = f.read()
    assert f'DEFAULT_CUDA_ARCHS = "{RELEASE_CUDA_ARCHS}"' in setup_py
    assert 'os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)' in setup_py
    assert f"export TORCH_CUDA_ARCH_LIST ?= {RELEASE_CUDA_ARCHS}\n" in makefile


@needs_cuda_build
@pytest.mark.skipif(not os.path.exists(CUOBJDUMP), reason="needs the CUDA toolkit's cuobjdump")
def test_the_cuda_library_refuses_gpus_by_the_archs_it_really_holds():
    """csrc/common/device_support.h tells a GPU it has no code for (an sm_110 Jetson Thor, say) from the arch
    lists setup.py compiled into the library: they must be the library's own cubins and PTX."""
    cuda_library = glob.glob(os.path.join(PACKAGE, "_cuda_ops*.so"))[0]
    elf = subprocess.run([CUOBJDUMP, "--list-elf", cuda_library], capture_output=True, text=True, check=True).stdout
    ptx = subprocess.run([CUOBJDUMP, "--list-ptx", cuda_library], capture_output=True, text=True, check=True).stdout
    cubins = sorted({int(a) for a in re.findall(r"\.sm_(\d+)[a-z]?\.cubin", elf)})
    ptx_archs = sorted({int(a) for a in re.findall(r"\.sm_(\d+)[a-z]?\.ptx", ptx)})
    with open(cuda_library, "rb") as f:
        data = f.read()
    assert cubins, elf
    for archs in (cubins, ptx_archs):
        if archs:  # a whole NUL-terminated string "90_100", not the tail of a longer list
            assert re.search(rb"(?<![0-9_])" + "_".join(map(str, archs)).encode() + rb"\x00", data), archs


@needs_cuda_build
@pytest.mark.skipif(torch.version.cuda is None, reason="torch is a CPU build: the CUDA library is not loaded")
@pytest.mark.parametrize("op", OPS)
def test_every_op_has_a_cuda_kernel(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fp8mp::{op}", "CUDA")


@pytest.mark.parametrize("op", CPU_ONLY_OPS)
def test_the_cpu_only_ops_have_no_cuda_kernel_to_fall_into(op):
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has(f"fp8mp::{op}", "CPU") and not has(f"fp8mp::{op}", "CUDA")


@pytest.mark.skipif(not os.path.exists(SCHEMA_FILE), reason="needs csrc/ops.cpp beside the tests")
def test_the_op_list_is_the_schema_and_the_library_registers_all_of_it():
    declared = declared_ops()
    assert len(declared) == len(set(declared)) > 0, declared
    with open(SCHEMA_FILE) as f:
        assert len(declared) == f.read().count("m.def("), "an m.def the pattern above does not read"
    assert sorted(declared) == registered_ops()
    assert set(CPU_ONLY_OPS) <= set(declared)
    assert "cast_to_fp8_transpose_dbias" in OPS and "block_scaled_grouped_gemm_wgrad" in OPS


@pytest.mark.parametrize("op", ALL_OPS)
def test_every_op_has_a_cpu_kernel(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fp8mp::{op}", "CPU")


def test_cuda_kernels_status_says_what_is_there():
    status = fp8mp.cuda_kernels_status()
    assert status.startswith("fp8mp CUDA kernels: ")
    assert ("not built" in status) == (_build_info.CUDA is None)


def test_the_package_metadata_pins_no_torch():
    pyproject = os.path.join(os.path.dirname(PACKAGE), "pyproject.toml")
    if os.path.exists(pyproject):  # the source tree
        with open(pyproject) as f:
            requires = re.search(r"^dependencies = \[(.*?)\]", f.read(), re.M).group(1).replace('"', "").split(", ")
    else:  # an installed wheel
        requires = importlib.metadata.requires("fp8mp")
    # torch itself, not a name that starts with it (the torchtitan extra)
    torch_requirements = [r.replace(" ", "") for r in requires if re.match(r"torch(?![A-Za-z0-9_.-])", r)]
    assert torch_requirements == ["torch>=2.11"], requires
