"""The import-time guards of fp8mp/ops/native.py: each ImportError branch of its loader, reached by giving
`_load` a build record or a torch that does not match. Every test calls `_load` itself, so removing a guard
from it makes the test fail (the loader would go on and load the libraries, or report success)."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from fp8mp.ops import native


def build_info(**fields) -> types.SimpleNamespace:
    """A build record like setup.py's fp8mp/ops/_build_info.py: CUDA is the compiling nvcc's release."""
    record = dict(TORCH_TARGET=(2, 11), BUILT_WITH_TORCH="2.14.1", CUDA="13.0", BUILT_WITH_TORCH_CUDA="13.0",
                  CUDA_ARCHS="8.9;9.0;10.0;12.0+PTX")
    record.update(fields)
    return types.SimpleNamespace(**record)


@pytest.fixture
def loads(monkeypatch):
    """The libraries _load would hand to torch.ops.load_library, recorded instead of loaded."""
    loaded = []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    return loaded


def test_no_build_record_is_an_import_error_saying_how_to_build(monkeypatch, loads):
    monkeypatch.setitem(sys.modules, "fp8mp.ops._build_info", None)  # `from fp8mp.ops import _build_info` fails
    monkeypatch.delattr("fp8mp.ops._build_info", raising=False)
    with pytest.raises(ImportError, match=r"native libraries are not built: install the wheel .* build_ext --inplace"):
        native._load()
    assert loads == []


def test_a_torch_older_than_the_stable_abi_target_is_refused(monkeypatch, loads):
    monkeypatch.setattr(native, "_build_info", lambda: build_info(TORCH_TARGET=(2, 11)))
    monkeypatch.setattr(torch, "__version__", "2.10.0+cu130")
    with pytest.raises(ImportError, match=r"fp8mp needs torch >= 2\.11 .* this environment has torch 2\.10\.0\+cu130"):
        native._load()
    assert loads == []


def test_the_same_torch_as_the_target_passes_the_version_check(monkeypatch, loads):
    monkeypatch.setattr(native, "_build_info", lambda: build_info(CUDA=None))
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    assert native._load() is False  # no CUDA library in this record: the CPU one only
    assert [p.endswith(".so") for p in loads] == [True]


def test_a_missing_cpu_library_is_an_import_error(monkeypatch, loads):
    monkeypatch.setattr(native, "_build_info", lambda: build_info())
    monkeypatch.setattr(native, "_library", lambda name: None)
    with pytest.raises(ImportError, match=r"native library _C\.abi3\.so is missing from .*: reinstall fp8mp"):
        native._load()
    assert loads == []


def _with_cuda_library(monkeypatch, nvcc: str, torch_cuda: str | None):
    monkeypatch.setattr(native, "_build_info", lambda: build_info(CUDA=nvcc, BUILT_WITH_TORCH_CUDA=torch_cuda))
    monkeypatch.setattr(native, "_library", lambda name: f"/fake/{name}.abi3.so")
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)


def test_kernels_compiled_by_another_major_toolkit_than_torchs_are_refused(monkeypatch, loads):
    # The build's torch had CUDA 13.0 like the runtime torch, but nvcc was 12.9: the guard compares nvcc's.
    _with_cuda_library(monkeypatch, nvcc="12.9", torch_cuda="13.0")
    with pytest.raises(ImportError, match=r"compiled by nvcc 12\.9 \(CUDA 12\), but this torch uses CUDA 13\.0: "
                                          r"install an fp8mp wheel built for CUDA 13\.x"):
        native._load()
    assert loads == ["/fake/_C.abi3.so"]  # the CPU library, never the CUDA one


def test_the_guard_reads_nvccs_release_not_the_toolkit_of_the_build_torch(monkeypatch, loads):
    # nvcc 13.0 built the kernels inside a torch of CUDA 12.8: a CUDA 13 torch loads them.
    monkeypatch.setattr(native, "_build_info",
                        lambda: build_info(CUDA="13.0", BUILT_WITH_TORCH_CUDA="12.8"))
    monkeypatch.setattr(native, "_library", lambda name: f"/fake/{name}.abi3.so")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert native._load() is True
    assert loads == ["/fake/_C.abi3.so", "/fake/_cuda_ops.abi3.so"]


def test_a_cpu_torch_skips_the_gpu_library_without_error(monkeypatch, loads):
    _with_cuda_library(monkeypatch, nvcc="12.9", torch_cuda=None)
    assert native._load() is False
    assert loads == ["/fake/_C.abi3.so"]


@pytest.mark.parametrize("text,parsed", [("2.11.0+cu130", (2, 11, 0)), ("13.0", (13, 0)), ("2.12.0a0", (2, 12, 0)),
                                         ("12.9", (12, 9))])
def test_version_strings_parse_to_numbers(text, parsed):
    assert native._version(text) == parsed
