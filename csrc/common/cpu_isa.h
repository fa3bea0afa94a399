// The instruction set fp8mp's vectorized CPU loops run with, and the dispatch that runs them with it.
//
// A hot loop is compiled three times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and baseline x86-64, by
// with_cpu_isa; cpu_isa() picks one: the best this CPU has, or a lower one that FP8MP_CPU_ISA=avx512|avx2|baseline
// asks for (read once per process; a level the CPU lacks falls to its best, with a warning on stderr). The cap
// also keeps the hand-written AVX-512 kernels (the cast's, the bf16 GEMMs') off, so one machine with AVX-512 runs
// what an AVX2-only or a baseline CPU runs. The build keeps IEEE fp32 semantics (no contraction or
// reassociation), so each level writes the same bits.
#pragma once

namespace fp8mp::cpu {

enum class CpuIsa : int { Baseline = 0, Avx2 = 1, Avx512 = 2 };

// The level the vector loops run with in this process (Baseline off x86-64).
CpuIsa cpu_isa();

// "avx512", "avx2" or "baseline".
const char* cpu_isa_name(CpuIsa isa);

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11  // x86-64-v4 needs GCC 11
#define FP8MP_ISA_DISPATCH 1
// Each copy inlines the whole loop (flatten: f, and everything it calls), so it is vectorized for that
// level; f must be a lambda calling inline functions and templates (not functions of another translation unit).
template <typename F>
__attribute__((target("arch=x86-64-v4"), flatten)) auto run_with_avx512(const F& f) {
  return f();
}
template <typename F>
__attribute__((target("arch=x86-64-v3"), flatten)) auto run_with_avx2(const F& f) {
  return f();
}
template <typename F>
__attribute__((flatten)) auto run_with_baseline(const F& f) {
  return f();
}

// f() in the copy compiled for cpu_isa().
template <typename F>
inline auto with_cpu_isa(const F& f) {
  switch (cpu_isa()) {
    case CpuIsa::Avx512: return run_with_avx512(f);
    case CpuIsa::Avx2: return run_with_avx2(f);
    default: return run_with_baseline(f);
  }
}
#else
#define FP8MP_ISA_DISPATCH 0
template <typename F>
inline auto with_cpu_isa(const F& f) {
  return f();
}
#endif

}  // namespace fp8mp::cpu

// cpu_isa_name(cpu_isa()), for fp8mp.ops.cpu_isa() (ctypes) and the tests.
extern "C" __attribute__((visibility("default"))) const char* fp8mp_cpu_isa();
