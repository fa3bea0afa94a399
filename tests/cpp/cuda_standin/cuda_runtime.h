// CPU stand-in for the CUDA runtime header, seen only by the CUDA glue (csrc/*/*_cuda.cpp) that the Catch2
// binary compiles against CPU tensors (tests/cpp/test_cuda_glue.cpp): the glue and the kernels' headers need
// the stream type alone, and make test-cpp needs no CUDA toolkit. The same typedef as CUDA's driver_types.h.
#pragma once

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
