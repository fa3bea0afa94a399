// Functions of the libraries torch has already loaded into this process (MKL's BLAS, linked into
// libtorch_cpu), found at run time so that fp8mp links against no torch-internal symbol.
#pragma once

namespace fp8mp {

// The address of `name` in the process, or nullptr. Never loads a library anew.
void* find_process_symbol(const char* name);

}  // namespace fp8mp
