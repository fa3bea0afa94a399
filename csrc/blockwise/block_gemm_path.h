// How the CUDA block_scaled_gemm runs a recipe on a given GPU and cuBLASLt, and how it pads the operands:
// pure host functions (no CUDA, no torch), so that Catch2 checks every GPU generation on the CPU
// (tests/cpp/test_cross_device_rules.cpp). block_gemm_cuda_kernels.cu is their one caller.
//
// Two paths:
//   Native   cuBLASLt's own block scale mode applies the scales inside the GEMM. cuBLASLt offers
//            OUTER_VEC_32F (rowwise) and VEC128_32F / BLK128x128_32F (DeepSeek-V3) on compute capability
//            9.x only (its "scaling mode support" table; NVIDIA reports CUBLAS_STATUS_NOT_SUPPORTED for
//            them on 10.x and 12.x), from cuBLASLt 12.9; VEC32_UE8M0 (MXFP8) on 10.x and 12.x, from
//            cuBLASLt 12.8. cuBLASLt 12.8.0 to 12.8.3 share one heuristic cache entry between an MXFP8
//            and a plain FP8 GEMM of the same shape; setting ALPHA_VECTOR_BATCH_STRIDE (unused by block
//            scaling) on the MXFP8 descriptor gives it a key of its own, as Transformer Engine does.
//   Chunked  on every other FP8 GPU (8.9 and up): one FP8 GEMM per K chunk of block_k (a single one
//            for rowwise, whose chunk is all of K) with unit scales and fp32 output, then one kernel
//            that folds the chunks in order as acc = acc + d_c * (sa[m, c] * sb[n, c]) in fp32: the
//            CPU emulation's arithmetic (blockwise_cpu_kernels.h), so the two differ only in the order
//            of the additions inside a chunk. Exact: an FP8 GEMM's fp32 output is the chunk's sum.
// Both write fp32 into scratch and round once to the output dtype, after adding the bias in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "blockwise/block_scale_layout.h"
#include "common/fp8_format.h"

namespace fp8mp {

// The recipe a call's block sizes select.
enum class BlockGemmRecipe : int {
  Rowwise = 0,   // 1 x K blocks on both operands, fp32 scales
  DeepSeek = 1,  // 1 x 128 / 128 x 128 blocks (not both 128 x 128), fp32 scales
  Mxfp8 = 2,     // 1 x 32 blocks, E8M0 scales
};

enum class BlockGemmPath : int { Native = 0, Chunked = 1 };

struct BlockGemmPathChoice {
  BlockGemmPath path;
  bool mxfp8_cache_key_workaround;  // Native MXFP8 on cuBLASLt <= 12.8.3
  std::string why_not;              // non-empty: no path on this GPU
};

// cublasLtGetVersion()'s encoding: major * 10000 + minor * 100 + patch.
constexpr size_t kCublasLtBlockModes = 120900;     // OUTER_VEC_32F, VEC128_32F, BLK128x128_32F
constexpr size_t kCublasLtMxfp8 = 120800;          // VEC32_UE8M0
constexpr size_t kCublasLtMxfp8CacheFixed = 120804;  // first version without the shared heuristic cache key

inline const char* block_gemm_recipe_name(BlockGemmRecipe recipe) {
  switch (recipe) {
    case BlockGemmRecipe::Rowwise: return "rowwise scaling (1 x K blocks)";
    case BlockGemmRecipe::DeepSeek: return "DeepSeek-V3 block scaling (1 x 128 and 128 x 128 blocks)";
    default: return "MXFP8 (1 x 32 blocks, E8M0 scales)";
  }
}

// Whether the native path runs cuBLASLt's Hopper block scale modes (OUTER_VEC_32F, VEC128_32F, BLK128x128_32F)
// for this operand pair. NVIDIA's examples and Transformer Engine's Float8BlockScaling (the recipe the modes
// came with, E4M3 by default) use them with E4M3 operands; cuBLASLt's documentation does not say clearly
// that they take an E5M2 operand, and no GPU has run one through them here. So a pair with an E5M2 operand
// (HYBRID: an E5M2 gradient x an E4M3 weight) takes the chunked path, whose tensor-scaled FP8 GEMMs cuBLASLt
// documents for E5M2 x E4M3 and E4M3 x E5M2: slower, not wrong.
inline bool native_block_modes_take(Fp8Format a, Fp8Format b) { return a == Fp8Format::E4M3 && b == Fp8Format::E4M3; }

// The path for `recipe` with operands a and b in `a_format` and `b_format` on a GPU of compute capability
// `cc` (major * 10 + minor) with the loaded cuBLASLt `runtime_version` (cublasLtGetVersion()) in a build
// against cuBLASLt headers `header_version` (CUBLAS_VERSION). force_chunked (FP8MP_BLOCK_GEMM_PATH=chunked)
// takes the chunked path wherever the GPU has FP8, so that it can be tested on a GPU that has the native one.
inline BlockGemmPathChoice choose_block_gemm_path(BlockGemmRecipe recipe, Fp8Format a_format, Fp8Format b_format,
                                                  int cc, size_t runtime_version, size_t header_version,
                                                  bool force_chunked) {
  if (cc < 89) {
    return {BlockGemmPath::Chunked, false,
            std::string(block_gemm_recipe_name(recipe)) +
                " needs FP8 tensor cores: a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell)"};
  }
  const int major = cc / 10;
  bool native = false;
  if (recipe == BlockGemmRecipe::Mxfp8) {
    native = (major == 10 || major == 12) && runtime_version >= kCublasLtMxfp8 && header_version >= kCublasLtMxfp8;
  } else {
    native = major == 9 && runtime_version >= kCublasLtBlockModes && header_version >= kCublasLtBlockModes &&
             native_block_modes_take(a_format, b_format);
  }
  if (!native || force_chunked) return {BlockGemmPath::Chunked, false, ""};
  return {BlockGemmPath::Native, recipe == BlockGemmRecipe::Mxfp8 && runtime_version < kCublasLtMxfp8CacheFixed, ""};
}

// Rows an operand of `layout` is zero-padded to a multiple of on the native path (padded rows give
// dropped outputs), at least `minimum` (what the operand's role needs: cuBLASLt's A, our b, is the
// leading dimension of D and a multiple of 16). 128 x 128 blocks: whole blocks, so that cuBLASLt sees
// no partial scale block. 1 x 128 blocks: a multiple of 8, what Transformer Engine requires of a
// VEC128_32F operand (cuBLASLt fails for M mod 8 in 1..4 with only the scale vectors' 4).
inline int64_t block_gemm_row_multiple(LtScaleLayout layout, int64_t minimum) {
  if (layout == LtScaleLayout::Blk128x128) return 128;
  if (layout == LtScaleLayout::Vec128) return minimum > 8 ? minimum : 8;
  return minimum;
}

}  // namespace fp8mp
