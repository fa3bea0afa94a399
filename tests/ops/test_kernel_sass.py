"""The cast kernels' sm_90 machine code uses vector global accesses.

Compiled from the torch-free kernel file with nvcc and read with cuobjdump, so
it runs on a CPU-only machine with a CUDA toolkit; skipped without one. The
speed goal itself (cast+amax+transpose >= 85% of x.clone() bandwidth) is
measured by benchmarks/gpu_check.sh on a GPU.
"""
from __future__ import annotations

import pytest

from sass_util import compile_sass, find_cuobjdump, find_nvcc, global_accesses, kernels

pytestmark = pytest.mark.skipif(not (find_nvcc() and find_cuobjdump()), reason="needs nvcc and cuobjdump")


@pytest.fixture(scope="module")
def cast_sass(tmp_path_factory):
    return global_accesses(compile_sass("cast/cast_cuda_kernels.cu", tmp_path_factory.mktemp("sass")))


def test_transpose_kernel_loads_16_bytes_and_stores_packed(cast_sass):
    transposes = kernels(cast_sass, "cast_transpose_kernel")
    assert len(transposes) == 6  # 3 input dtypes x 2 formats
    for name, ops in transposes.items():
        assert ops["LDG.E.128"] >= 2, (name, ops)  # the full-tile loads of x
        assert ops["STG.E.128"] >= 1, (name, ops)  # 16 codes of yt per thread
    for name, ops in kernels(cast_sass, "cast_transpose_kernel", "bf16").items():
        assert ops["STG.E.64"] >= 2, (name, ops)  # 8 codes of y per vector
        assert ops["LDG.E.U16"] <= 16, (name, ops)  # element loads only on the edge path


def test_decode_and_plain_cast_use_vectors(cast_sass):
    decoders = kernels(cast_sass, "cast_from_fp8_kernel", "Lb1E")  # the aligned instantiations
    assert len(decoders) == 6
    for name, ops in decoders.items():
        assert ops["LDG.E.128"] >= 1 and ops["STG.E.128"] >= 2, (name, ops)
    casts = kernels(cast_sass, "cast_kernel", "Lb1E")
    assert len(casts) == 6
    for name, ops in casts.items():
        assert ops["LDG.E.128"] >= 1, (name, ops)
