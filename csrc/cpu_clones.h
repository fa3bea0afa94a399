// FP8MP_CPU_CLONES: clone a hot CPU loop for AVX2 and baseline x86-64, picked
// at load time. The AVX2 loops are about 2.5x faster, and the extension still
// runs on any x86-64 CPU.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define FP8MP_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FP8MP_CPU_CLONES
#endif
