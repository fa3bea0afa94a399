// CUDA block_scaled_gemm with cuBLASLt, on every FP8 GPU: which path a GPU takes and why is
// block_gemm_path.h's (native block scale modes where cuBLASLt has them, chunked FP8 GEMMs elsewhere).
//
// out [M, N] = a [M, K] @ b [N, K]^T in cuBLASLt's "TN" layout, as fp8_gemm (gemm_cuda_kernels.cu):
// cuBLASLt's A is our b (K x N_pad column-major), its B our a (K x M), its D out^T (N_pad x M), always
// fp32, in scratch. cuBLASLt multiplies the FP8 values exactly and accumulates in fp32; the order of
// the additions inside a K chunk is the tensor cores', so results agree with the CPU emulation to fp32
// accumulation noise, not bit for bit.
//
// Per call:
//   1. K is zero-padded to whole scale tiles (128 for DeepSeek-V3 and for MXFP8's 4 x 32, 16 for
//      rowwise, the FP8 minimum) and N to 16; on the native path an operand in 128 x 128 blocks is padded
//      to whole blocks and one in 1 x 128 blocks to a multiple of 8 rows (block_gemm_row_multiple): zero
//      codes add exact zeros, padded rows give dropped outputs;
//   2. native: each operand's naive scale_inv is rearranged into the layout cuBLASLt reads
//      (block_scale_layout.h), padding zeroed, and one GEMM applies them;
//      chunked: per group of K chunks whose fp32 products fit kChunkScratchBytes, one unit-scale FP8 GEMM
//      per chunk (cuBLASLt's scale pointers left NULL: scale 1), each into its own fp32 buffer;
//   3. one kernel (fold_kernel) folds the products in chunk order with their two scales into an fp32
//      accumulator (chunked) or takes the scaled product (native), adds the bias in fp32 and rounds once
//      to the output dtype: no double rounding of a 16-bit output with a bias.
// The descriptor, layouts and chosen algorithm are cached per configuration and thread (BlockPlanKey),
// so a repeated GEMM costs no heuristic query; the heuristic is asked once per power-of-two bucket of the
// sizes (heuristic_shape.h), whose algorithm each exact configuration checks (the grouped GEMMs' sizes change).
#include "blockwise/block_gemm_cuda_kernels.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "blockwise/block_scale_rule.h"
#include "common/cuda_check.cuh"
#include "common/device_support.h"
#include "gemm/cublaslt_helpers.h"
#include "gemm/gemm_plan_cache.h"
#include "gemm/heuristic_shape.h"

namespace fp8mp::cuda {
namespace {

constexpr char kOp[] = "fp8mp::block_scaled_gemm";
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr size_t kChunkScratchBytes = size_t(256) << 20;  // fp32 chunk products held at once (at least one chunk)
constexpr int kThreads = 256;
constexpr int64_t kNAlign = 16;  // cuBLASLt FP8: the leading dimension of D (N) a multiple of 16

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t x, int64_t m) { return ceil_div(x, m) * m; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned blocks_for(int64_t items) {
  const int64_t max_blocks = int64_t(current_device_sm_count()) * 8;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(ceil_div(items, kThreads), max_blocks)));
}

int32_t lt_scale_mode(LtScaleLayout layout) {
  switch (layout) {
#if CUBLAS_VERSION >= 120900
    case LtScaleLayout::OuterVec: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case LtScaleLayout::Vec128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case LtScaleLayout::Blk128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
#endif
#if CUBLAS_VERSION >= 120800
    case LtScaleLayout::Vec32Swizzled: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
#endif
    default:  // choose_block_gemm_path takes the native path only where the headers have the mode
      throw std::logic_error(std::string(kOp) + ": no cuBLASLt scale mode for this layout in cuBLASLt headers " +
                             cublaslt_version_string(CUBLAS_VERSION));
  }
}

// What K is zero-padded to: whole scale blocks (DeepSeek-V3), whole 4-chunk columns of the swizzled
// MXFP8 scale tiles (so that cuBLASLt reads no partial tile), the FP8 minimum of 16 (rowwise).
int64_t k_multiple(BlockGemmRecipe recipe) {
  switch (recipe) {
    case BlockGemmRecipe::DeepSeek: return 128;
    case BlockGemmRecipe::Mxfp8: return 4 * 32;
    default: return 16;
  }
}

size_t scale_element_bytes(BlockGemmRecipe recipe) { return recipe == BlockGemmRecipe::Mxfp8 ? 1 : 4; }

// Where each buffer of one call lives in the scratch (256-byte aligned), and the padded sizes.
struct ScratchPlan {
  BlockGemmPath path;
  int64_t M, N, M_pad, K_pad, N_pad, k_tiles;
  int64_t chunk_k;     // K of each cuBLASLt GEMM: K_pad (native, rowwise) or block_k (chunked)
  int64_t chunks;      // GEMMs: 1 (native) or ceil(K / block_k) (chunked)
  int64_t group;       // chunk products held at once
  bool copy_a, copy_b;
  LtScaleShape a_scales, b_scales;  // native only
  size_t a_offset, b_offset, a_scales_offset, b_scales_offset, d_offset, acc_offset, bytes;
};

ScratchPlan plan_scratch(const BlockGemmArgs& g, BlockGemmPath path) {
  ScratchPlan p{};
  p.path = path;
  p.M = g.a.rows;
  p.N = g.b.rows;
  p.K_pad = round_up(g.K, k_multiple(g.recipe));
  const bool native = path == BlockGemmPath::Native;
  p.M_pad = native ? round_up(p.M, block_gemm_row_multiple(g.a.layout, 1)) : p.M;
  p.N_pad = native ? round_up(p.N, block_gemm_row_multiple(g.b.layout, kNAlign)) : round_up(p.N, kNAlign);
  p.k_tiles = ceil_div(g.K, g.block_k);
  const bool one_gemm = native || g.recipe == BlockGemmRecipe::Rowwise;
  p.chunk_k = one_gemm ? p.K_pad : g.block_k;
  p.chunks = one_gemm ? 1 : p.k_tiles;
  const size_t product_bytes = size_t(p.M_pad * p.N_pad) * sizeof(float);
  p.group = std::max<int64_t>(1, std::min<int64_t>(p.chunks, int64_t(kChunkScratchBytes / product_bytes)));
  p.copy_a = p.K_pad != g.K || p.M_pad != p.M || !aligned16(g.a.data);
  p.copy_b = p.K_pad != g.K || p.N_pad != p.N || !aligned16(g.b.data);
  size_t offset = kWorkspaceBytes;
  const auto take = [&](bool needed, size_t bytes) {
    const size_t at = offset;
    if (needed) offset += (bytes + 255) / 256 * 256;
    return at;
  };
  p.a_offset = take(p.copy_a, size_t(p.M_pad * p.K_pad));
  p.b_offset = take(p.copy_b, size_t(p.N_pad * p.K_pad));
  if (native) {
    p.a_scales = lt_scale_shape(g.a.layout, p.M_pad, p.k_tiles);  // cuBLASLt's B: M_pad rows
    p.b_scales = lt_scale_shape(g.b.layout, p.N_pad, p.k_tiles);  // cuBLASLt's A: N_pad rows
    p.a_scales_offset = take(true, size_t(p.a_scales.elements) * scale_element_bytes(g.recipe));
    p.b_scales_offset = take(true, size_t(p.b_scales.elements) * scale_element_bytes(g.recipe));
  }
  p.d_offset = take(true, product_bytes * size_t(p.group));
  p.acc_offset = take(p.group < p.chunks, size_t(p.M * p.N) * sizeof(float));
  p.bytes = offset;
  return p;
}

// dst [dst_rows, dst_cols] = src [rows, cols] in its top-left corner, zeros elsewhere (bytes).
__global__ void pad_codes_kernel(const uint8_t* __restrict__ src, int64_t rows, int64_t cols, uint8_t* __restrict__ dst,
                                 int64_t dst_rows, int64_t dst_cols) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < dst_rows * dst_cols; i += stride) {
    const int64_t r = i / dst_cols, c = i - r * dst_cols;
    dst[i] = (r < rows && c < cols) ? src[r * cols + c] : uint8_t(0);
  }
}

// The naive scales [src_outer, src_k] rearranged into cuBLASLt's layout, every slot written (padding 0).
template <typename T>
__global__ void lt_scale_kernel(const T* __restrict__ src, int64_t src_outer, int64_t src_k, LtScaleLayout layout,
                                LtScaleShape shape, T* __restrict__ dst) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < shape.elements; i += stride) {
    const int64_t o = i / shape.k_tiles, k = i - o * shape.k_tiles;
    dst[lt_scale_offset(layout, shape, o, k)] = (o < src_outer && k < src_k) ? src[o * src_k + k] : T(0);
  }
}

// The naive scale_inv of both operands ([ceil(rows / block_rows), chunks] row-major), as the fold reads them.
struct ChunkScales {
  const void* a;
  int64_t a_block_rows;
  const void* b;
  int64_t b_block_rows;
  int64_t chunks;
  bool e8m0;  // E8M0 codes (2^(code - 127), 255 = NaN), else fp32 values
};

__device__ __forceinline__ float scale_value(const void* scales, int64_t index, bool e8m0) {
  if (!e8m0) return static_cast<const float*>(scales)[index];
  const int code = static_cast<const uint8_t*>(scales)[index];
  return code == 255 ? bits_to_float(kCanonicalNanBits) : block_exact_pow2(code - 127);  // the CPU's e8m0 table
}

// out [M, N] (or, when !last, acc) from the fp32 products d [chunks_here][M rows of ld_d]:
//   scales given (chunked): v = (first ? 0 : acc) folded over the chunks c0, c0 + 1, ... in order as
//                           v = v + d_c * (sa[m, c] * sb[n, c]), the CPU emulation's expression;
//   no scales (native):     v = d (cuBLASLt applied them);
// then out = out_t(v + bias) in fp32, rounded once. d == nullptr (K == 0): out = bias or zeros, as on the CPU.
template <typename out_t>
__global__ void fold_kernel(const float* __restrict__ d, int64_t chunks_here, int64_t chunk_stride, int64_t c0,
                            int64_t M, int64_t N, int64_t ld_d, ChunkScales scales, bool scaled, float* acc, bool first,
                            bool last, const out_t* __restrict__ bias, out_t* __restrict__ out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N; i += stride) {
    const int64_t m = i / N, n = i - m * N;
    if (d == nullptr) {
      out[i] = bias != nullptr ? bias[n] : static_cast<out_t>(0.0f);
      continue;
    }
    float v;
    if (scaled) {
      v = first ? 0.0f : acc[i];
      const int64_t a_row = (m / scales.a_block_rows) * scales.chunks, b_row = (n / scales.b_block_rows) * scales.chunks;
      for (int64_t j = 0; j < chunks_here; ++j) {
        const int64_t c = c0 + j;
        const float s = __fmul_rn(scale_value(scales.a, a_row + c, scales.e8m0), scale_value(scales.b, b_row + c, scales.e8m0));
        v = __fadd_rn(v, __fmul_rn(d[j * chunk_stride + m * ld_d + n], s));
      }
    } else {
      v = d[m * ld_d + n];
    }
    if (!last) {
      acc[i] = v;
      continue;
    }
    if (bias != nullptr) v = __fadd_rn(v, static_cast<float>(bias[n]));
    out[i] = static_cast<out_t>(v);
  }
}

struct FoldStep {
  const float* d;
  int64_t chunks_here, chunk_stride, c0, ld_d;
  bool scaled, first, last;
};

void fold(const BlockGemmArgs& g, const FoldStep& step, const ChunkScales& scales, float* acc, cudaStream_t stream) {
  const int64_t M = g.a.rows, N = g.b.rows;
  FP8MP_DISPATCH_HP(g.out_type, [&] {
    fold_kernel<scalar_t><<<blocks_for(M * N), kThreads, 0, stream>>>(
        step.d, step.chunks_here, step.chunk_stride, step.c0, M, N, step.ld_d, scales, step.scaled, acc, step.first,
        step.last, static_cast<const scalar_t*>(g.bias), static_cast<scalar_t*>(g.out));
    FP8MP_CUDA_LAUNCH_CHECK();
  });
}

void rearrange_scales(const BlockGemmOperand& op, BlockGemmRecipe recipe, int64_t k_tiles, const LtScaleShape& shape,
                      void* dst, cudaStream_t stream) {
  const int64_t src_outer = ceil_div(op.rows, op.block_rows);
  if (scale_element_bytes(recipe) == 1) {
    lt_scale_kernel<uint8_t><<<blocks_for(shape.elements), kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(op.scale_inv), src_outer, k_tiles, op.layout, shape, static_cast<uint8_t*>(dst));
  } else {
    lt_scale_kernel<float><<<blocks_for(shape.elements), kThreads, 0, stream>>>(
        static_cast<const float*>(op.scale_inv), src_outer, k_tiles, op.layout, shape, static_cast<float*>(dst));
  }
  FP8MP_CUDA_LAUNCH_CHECK();
}

const uint8_t* padded_codes(const BlockGemmOperand& op, bool copy, int64_t K, int64_t rows_pad, int64_t K_pad,
                            uint8_t* at, cudaStream_t stream) {
  if (!copy) return op.data;
  pad_codes_kernel<<<blocks_for(rows_pad * K_pad), kThreads, 0, stream>>>(op.data, op.rows, K, at, rows_pad, K_pad);
  FP8MP_CUDA_LAUNCH_CHECK();
  return at;
}

std::string format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "float8_e4m3fn" : "float8_e5m2"; }

// What a cached cuBLASLt plan depends on: everything the descriptor, layouts and heuristic see but the
// data and scale pointers, which are set or passed per call (as fp8_gemm's plans are: gemm_plan_cache.h,
// whose per-thread reasoning applies here too).
struct BlockPlanKey {
  int device;
  int path, a_layout, b_layout, a_format, b_format;
  bool cache_key_workaround;
  int64_t M_pad, N_pad, chunk_k, ld;
  uint32_t align_a, align_b, align_d;

  bool operator==(const BlockPlanKey& o) const {
    return device == o.device && path == o.path && a_layout == o.a_layout && b_layout == o.b_layout &&
           a_format == o.a_format && b_format == o.b_format && cache_key_workaround == o.cache_key_workaround &&
           M_pad == o.M_pad && N_pad == o.N_pad && chunk_k == o.chunk_k && ld == o.ld && align_a == o.align_a &&
           align_b == o.align_b && align_d == o.align_d;
  }
};

struct BlockPlanKeyHash {
  size_t operator()(const BlockPlanKey& k) const {
    size_t h = std::hash<int64_t>()(k.M_pad);
    const auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
    mix(uint64_t(k.N_pad));
    mix(uint64_t(k.chunk_k));
    mix(uint64_t(k.ld));
    mix((uint64_t(uint32_t(k.device)) << 32) | (uint64_t(k.path) << 24) | (uint64_t(k.a_layout) << 20) |
        (uint64_t(k.b_layout) << 16) | (uint64_t(k.a_format) << 12) | (uint64_t(k.b_format) << 8) |
        uint64_t(k.cache_key_workaround));
    mix((uint64_t(k.align_a) << 40) | (uint64_t(k.align_b) << 20) | uint64_t(k.align_d));
    return h;
  }
};

void set_scale_pointers(cublasLtMatmulDesc_t desc, const void* a_scales, const void* b_scales) {
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scales);  // cuBLASLt's A is our b
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scales);
}

constexpr size_t kMaxCachedPlans = 1024;  // distinct GEMM configurations per thread before the cache starts over
// An algorithm, or none (nvcc 13's front end fails on a std::optional of cuBLASLt's algorithm struct).
struct MaybeAlgo {
  bool found;
  cublasLtMatmulAlgo_t algo;
};

// The heuristic's first algorithm for `desc` over these layouts; `status` gets the query's status.
MaybeAlgo query_heuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, const BlockPlanKey& key,
                          cublasStatus_t* status) {
  const Preference pref = make_preference<kOp>(uint64_t(kWorkspaceBytes), key.align_b, key.align_a, key.align_d);
  cublasLtMatmulHeuristicResult_t heuristic{};
  int returned = 0;
  *status = cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref.get(), 1, &heuristic, &returned);
  return {*status == CUBLAS_STATUS_SUCCESS && returned > 0, heuristic.algo};
}

// The algorithm of `key`'s bucket (M_pad, and K_pad where one GEMM spans all of K, rounded up to powers of
// two: heuristic_shape.h), asked about once per bucket and thread with the first call's descriptor.
MaybeAlgo bucket_algo(cublasLtHandle_t handle, const BlockPlanKey& key, const BlockGemmArgs& g,
                      cublasLtMatmulDesc_t desc) {
  BlockPlanKey bucket = key;
  bucket.M_pad = heuristic_extent(key.M_pad);
  if (key.chunk_k == key.ld) bucket.chunk_k = bucket.ld = heuristic_extent(key.ld);
  thread_local std::unordered_map<BlockPlanKey, MaybeAlgo, BlockPlanKeyHash> algos;
  const auto found = algos.find(bucket);
  if (found != algos.end()) return found->second;
  const Layout a = make_matrix_layout<kOp>(fp8_cuda_type(g.b.format), bucket.chunk_k, key.N_pad, bucket.ld);
  const Layout b = make_matrix_layout<kOp>(fp8_cuda_type(g.a.format), bucket.chunk_k, bucket.M_pad, bucket.ld);
  const Layout d = make_matrix_layout<kOp>(CUDA_R_32F, key.N_pad, bucket.M_pad, key.N_pad);
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const MaybeAlgo algo = query_heuristic(handle, desc, a.get(), b.get(), d.get(), bucket, &status);
  if (algos.size() >= kMaxCachedPlans) algos.clear();
  algos.emplace(bucket, algo);
  return algo;
}

// Descriptor, layouts and heuristic for `key`, built on first use by this thread (on the native path with
// the first call's scale pointers set, as the heuristic query sees them).
GemmPlan build_plan(cublasLtHandle_t handle, const BlockPlanKey& key, const BlockGemmArgs& g, const void* a_scales,
                    const void* b_scales, const DeviceDescription& gpu) {
  cublasLtMatmulDesc_t raw_desc = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  GemmPlan plan{};
  plan.desc = MatmulDesc(raw_desc);
  cublasLtMatmulDesc_t desc = plan.desc.get();
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(CUBLAS_OP_T));
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(CUBLAS_OP_N));
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(0));  // promoted accumulation
  const bool native = key.path == int(BlockGemmPath::Native);
  if (native) {  // the chunked path leaves the scale pointers NULL: cuBLASLt's scale 1
    // cuBLASLt's A is our b, its B our a.
    set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_scale_mode(g.b.layout));
    set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_scale_mode(g.a.layout));
    set_scale_pointers(desc, a_scales, b_scales);
    if (key.cache_key_workaround) {  // unused by block scaling; gives MXFP8 its own heuristic cache key
      set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, int64_t(1));
    }
  }
  plan.a_layout = make_matrix_layout<kOp>(fp8_cuda_type(g.b.format), key.chunk_k, key.N_pad, key.ld);
  plan.b_layout = make_matrix_layout<kOp>(fp8_cuda_type(g.a.format), key.chunk_k, key.M_pad, key.ld);
  plan.d_layout = make_matrix_layout<kOp>(CUDA_R_32F, key.N_pad, key.M_pad, key.N_pad);

  // The algorithm of the key's power-of-two bucket of M_pad and (one GEMM over all of K) K_pad, where
  // cublasLtMatmulAlgoCheck accepts it for these exact layouts (heuristic_shape.h); else the exact sizes'.
  MaybeAlgo algo = bucket_algo(handle, key, g, desc);
  algo.found = algo.found && algo_accepted(handle, desc, plan.a_layout.get(), plan.b_layout.get(),
                                           plan.d_layout.get(), algo.algo, kWorkspaceBytes);
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  if (!algo.found) algo = query_heuristic(handle, desc, plan.a_layout.get(), plan.b_layout.get(), plan.d_layout.get(),
                                          key, &status);
  // A configuration cuBLASLt cannot run comes back as NOT_SUPPORTED or as zero results: either way the
  // error says what was asked for, on which GPU and cuBLASLt.
  if (!algo.found) {
    throw std::runtime_error(
        std::string(kOp) + ": cuBLASLt " + cublaslt_version_string(cublasLtGetVersion()) + " found no algorithm (" +
        cublasLtGetStatusName(status) + ") for " +
        block_gemm_recipe_name(g.recipe) + (native ? " with its block scale mode" : " as unit-scale FP8 GEMMs per K chunk") +
        " on " + gpu.text() + " with a " + format_name(g.a.format) + " [" + std::to_string(key.M_pad) + ", " +
        std::to_string(key.chunk_k) + "], b " + format_name(g.b.format) + " [" + std::to_string(key.N_pad) + ", " +
        std::to_string(key.chunk_k) + "] (padded, leading dimension " + std::to_string(key.ld) + ") and a float32 product");
  }
  plan.algo = algo.algo;
  return plan;
}

GemmPlan& cached_plan(cublasLtHandle_t handle, const BlockPlanKey& key, const BlockGemmArgs& g, const void* a_scales,
                      const void* b_scales, const DeviceDescription& gpu) {
  thread_local std::unordered_map<BlockPlanKey, GemmPlan, BlockPlanKeyHash> cache;
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  GemmPlan built = build_plan(handle, key, g, a_scales, b_scales, gpu);  // may throw: nothing is cached then
  if (cache.size() >= kMaxCachedPlans) cache.clear();
  return cache.emplace(key, std::move(built)).first->second;
}

bool chunked_path_forced() {
  const char* value = std::getenv("FP8MP_BLOCK_GEMM_PATH");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) return false;
  if (std::strcmp(value, "chunked") == 0) return true;
  throw std::runtime_error(std::string(kOp) + ": FP8MP_BLOCK_GEMM_PATH must be 'auto' or 'chunked', got '" + value +
                           "'");
}

// The path for this call on the current GPU, or the error that names the GPU and what is needed.
BlockGemmPathChoice path_for(const BlockGemmArgs& g, const DeviceDescription& gpu) {
  BlockGemmPathChoice choice = choose_block_gemm_path(g.recipe, g.a.format, g.b.format, gpu.compute_capability,
                                                      cublasLtGetVersion(), size_t(CUBLAS_VERSION),
                                                      chunked_path_forced());
  if (!choice.why_not.empty()) throw std::runtime_error(std::string(kOp) + ": " + choice.why_not + "; " + gpu.text());
  return choice;
}

}  // namespace

size_t block_scaled_gemm_scratch_bytes(const BlockGemmArgs& args) {
  if (args.a.rows == 0 || args.b.rows == 0 || args.K == 0) return 0;
  const DeviceDescription gpu = current_device_description();
  return plan_scratch(args, path_for(args, gpu).path).bytes;
}

void block_scaled_gemm(cublasLtHandle_t handle, const BlockGemmArgs& g, void* scratch, cudaStream_t stream) {
  const int64_t M = g.a.rows, N = g.b.rows;
  if (M == 0 || N == 0) return;
  const ChunkScales scales{g.a.scale_inv, g.a.block_rows, g.b.scale_inv, g.b.block_rows, ceil_div(g.K, g.block_k),
                           g.recipe == BlockGemmRecipe::Mxfp8};
  if (g.K == 0) {  // an empty sum: the result is the bias (or zeros), whatever the scales
    fold(g, FoldStep{nullptr, 0, 0, 0, 0, false, true, true}, scales, nullptr, stream);
    return;
  }
  const DeviceDescription gpu = current_device_description();
  check_device_code(gpu, kOp);
  const BlockGemmPathChoice choice = path_for(g, gpu);
  const ScratchPlan p = plan_scratch(g, choice.path);
  const bool native = choice.path == BlockGemmPath::Native;
  uint8_t* base = static_cast<uint8_t*>(scratch);
  const uint8_t* a_p = padded_codes(g.a, p.copy_a, g.K, p.M_pad, p.K_pad, base + p.a_offset, stream);
  const uint8_t* b_p = padded_codes(g.b, p.copy_b, g.K, p.N_pad, p.K_pad, base + p.b_offset, stream);
  void* a_scales = nullptr;
  void* b_scales = nullptr;
  if (native) {
    a_scales = base + p.a_scales_offset;
    b_scales = base + p.b_scales_offset;
    rearrange_scales(g.a, g.recipe, p.k_tiles, p.a_scales, a_scales, stream);
    rearrange_scales(g.b, g.recipe, p.k_tiles, p.b_scales, b_scales, stream);
  }
  float* d = reinterpret_cast<float*>(base + p.d_offset);
  float* acc = reinterpret_cast<float*>(base + p.acc_offset);
  const int64_t product_elements = p.M_pad * p.N_pad;
  // Every chunk's operand and product pointers are offsets of these: their alignment is the least of the bases'
  // and the steps' (chunk_k bytes of codes, one product of floats).
  const uint32_t step_align_codes = pointer_alignment(reinterpret_cast<const void*>(uintptr_t(p.chunk_k)));
  const uint32_t step_align_d =
      pointer_alignment(reinterpret_cast<const void*>(uintptr_t(product_elements * int64_t(sizeof(float)))));
  const BlockPlanKey key{gpu.device,
                         int(choice.path),
                         native ? int(g.a.layout) : -1,
                         native ? int(g.b.layout) : -1,
                         int(g.a.format),
                         int(g.b.format),
                         choice.mxfp8_cache_key_workaround,
                         p.M_pad,
                         p.N_pad,
                         p.chunk_k,
                         p.K_pad,
                         std::min(pointer_alignment(a_p), step_align_codes),
                         std::min(pointer_alignment(b_p), step_align_codes),
                         std::min(pointer_alignment(d), step_align_d)};
  GemmPlan& plan = cached_plan(handle, key, g, a_scales, b_scales, gpu);
  if (native) set_scale_pointers(plan.desc.get(), a_scales, b_scales);  // this call's, on this thread's descriptor
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t c0 = 0; c0 < p.chunks; c0 += p.group) {
    const int64_t here = std::min(p.group, p.chunks - c0);
    for (int64_t j = 0; j < here; ++j) {
      const int64_t k0 = (c0 + j) * p.chunk_k;  // chunk c's columns [k0, k0 + chunk_k) of both operands
      float* d_j = d + j * product_elements;
      FP8MP_CUBLASLT_CHECK(cublasLtMatmul(handle, plan.desc.get(), &alpha, b_p + k0, plan.a_layout.get(), a_p + k0,
                                          plan.b_layout.get(), &beta, d_j, plan.d_layout.get(), d_j,
                                          plan.d_layout.get(), &plan.algo, base, kWorkspaceBytes, stream));
    }
    const bool last = c0 + here == p.chunks;
    fold(g, FoldStep{d, here, product_elements, c0, p.N_pad, !native, c0 == 0, last}, scales, acc, stream);
  }
}

}  // namespace fp8mp::cuda
