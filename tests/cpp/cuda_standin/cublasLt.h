// CPU stand-in for cuBLASLt's header, for the CUDA glue compiled into the Catch2 binary (see cuda_runtime.h
// here): the glue passes a handle along and nothing else. The same typedef as cublasLt.h.
#pragma once

struct cublasLtContext;
typedef struct cublasLtContext* cublasLtHandle_t;
