// CUDA block_scaled_gemm: cuBLASLt's block scale modes (cuBLASLt >= 12.9 headers).
//
// out [M, N] = a [M, K] @ b [N, K]^T in cuBLASLt's "TN" layout, as fp8_gemm (gemm_cuda_kernels.cu):
// cuBLASLt's A is our b (K x N_pad column-major), its B our a (K x M), its D out^T (N_pad x M) in
// the output dtype. cuBLASLt multiplies the FP8 values exactly and applies each K chunk's two scales
// while accumulating in fp32, the arithmetic the CPU emulation defines (blockwise_cpu_kernels.h);
// the order of the additions inside a chunk is the tensor cores', so results agree with the CPU to
// fp32 accumulation noise, not bit for bit.
//
// Per call:
//   1. K is zero-padded to whole scale tiles (128 for DeepSeek-V3 and for MXFP8's 4 x 32, 16 for
//      rowwise, the FP8 minimum), N to 16, an operand in 128 x 128 blocks to whole blocks and one in 1 x 128 blocks
//      to a multiple of 4 rows: zero codes add exact zeros, padded rows give dropped outputs;
//   2. each operand's naive scale_inv is rearranged into the layout cuBLASLt reads (block_scale_layout.h:
//      M/N-major VEC128, K-minor padded BLK128x128, the 128 x 4 swizzle of VEC32_UE8M0), padding zeroed;
//   3. cuBLASLt rounds its fp32 accumulator once to the output dtype (D of the output's type, as
//      torch's _scaled_mm and Transformer Engine call it, the configurations cuBLASLt supports
//      widely) into scratch; one kernel drops the padded columns and adds the bias in fp32, rounding
//      once more. So with a bias and a 16-bit output the result is rounded twice, where the CPU rounds
//      acc + bias once: a difference of at most one unit in the last place of the accumulator's
//      16-bit rounding (the tests allow for it). Without a bias, or for fp32 outputs, one rounding.
// Which recipes a GPU and cuBLASLt run is checked first (compute capability, cublasLtGetVersion); when
// one cannot, the error names what is needed and what was found. Nothing falls back to another GEMM.
// The descriptor, layouts and chosen algorithm are cached per configuration and thread (BlockPlanKey),
// so a repeated GEMM costs no heuristic query.
#include "blockwise/block_gemm_cuda_kernels.cuh"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "common/cuda_check.cuh"
#include "gemm/cublaslt_helpers.h"
#include "gemm/gemm_plan_cache.h"

namespace fp8mp::cuda {
namespace {

constexpr char kOp[] = "fp8mp::block_scaled_gemm";
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int kThreads = 256;
constexpr int64_t kNAlign = 16;  // cuBLASLt FP8: the leading dimension of D (N) a multiple of 16

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t x, int64_t m) { return ceil_div(x, m) * m; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned blocks_for(int64_t items) {
  const int64_t max_blocks = int64_t(current_device_sm_count()) * 8;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(ceil_div(items, kThreads), max_blocks)));
}

struct Requirement {
  int compute_capability;  // major * 10 + minor
  size_t cublaslt_version;  // cublasLtGetVersion()
  const char* what;
};

Requirement requirement(BlockGemmRecipe recipe) {
  switch (recipe) {
    case BlockGemmRecipe::Rowwise:
      return {90, 120900, "rowwise scaling (1 x K blocks, cuBLASLt OUTER_VEC_32F scales)"};
    case BlockGemmRecipe::DeepSeek:
      return {90, 120900, "DeepSeek-V3 block scaling (1 x 128 and 128 x 128 blocks, cuBLASLt VEC128_32F / "
                          "BLK128x128_32F scales)"};
    default:
      return {100, 120800, "MXFP8 (1 x 32 blocks, E8M0 scales, cuBLASLt VEC32_UE8M0 swizzled scales)"};
  }
}

int current_compute_capability(int device) {
  int major = 0, minor = 0;
  FP8MP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FP8MP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

std::string capability_string(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// What the device and the loaded cuBLASLt offer, against what the recipe needs.
void check_device_and_cublaslt(BlockGemmRecipe recipe, int device, int cc) {
  const Requirement need = requirement(recipe);
  const size_t version = cublasLtGetVersion();
  if (cc < need.compute_capability || version < need.cublaslt_version) {
    throw std::runtime_error(std::string(kOp) + ": " + need.what + " needs a GPU of compute capability " +
                             capability_string(need.compute_capability) + " or newer and cuBLASLt " +
                             cublaslt_version_string(need.cublaslt_version) + " or newer; cuda:" +
                             std::to_string(device) + " has compute capability " + capability_string(cc) +
                             " and the loaded cuBLASLt is " + cublaslt_version_string(version));
  }
}

int32_t lt_scale_mode(LtScaleLayout layout) {
#if CUBLAS_VERSION >= 120900
  switch (layout) {
    case LtScaleLayout::OuterVec: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case LtScaleLayout::Vec128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case LtScaleLayout::Blk128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
  }
#else
  (void)layout;
  throw std::runtime_error(std::string(kOp) + ": this fp8mp was built with cuBLASLt headers " +
                           cublaslt_version_string(CUBLAS_VERSION) +
                           ", which lack the block scale modes (12.9 or newer needed): rebuild fp8mp against CUDA 12.9+");
#endif
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

size_t element_bytes(HpType type) { return type == HpType::Float32 ? 4 : 2; }

cudaDataType_t cuda_type(HpType type) {
  switch (type) {
    case HpType::Float32: return CUDA_R_32F;
    case HpType::BFloat16: return CUDA_R_16BF;
    default: return CUDA_R_16F;
  }
}

// Where each buffer of one call lives in the scratch (256-byte aligned), and the padded sizes.
struct ScratchPlan {
  int64_t M, N, M_pad, K_pad, N_pad, k_tiles;
  bool copy_a, copy_b;
  LtScaleShape a_scales, b_scales;
  size_t a_offset, b_offset, a_scales_offset, b_scales_offset, d_offset, bytes;
};

ScratchPlan plan_scratch(const BlockGemmArgs& g) {
  ScratchPlan p{};
  p.M = g.a.rows;
  p.N = g.b.rows;
  p.K_pad = round_up(g.K, k_multiple(g.recipe));
  // An operand in 128 x 128 blocks is padded to whole blocks (zero rows: dropped outputs), so that
  // cuBLASLt never sees a partial scale block, one in 1 x 128 blocks to a multiple of 4 rows (the
  // VEC128 scale vectors are padded to 4), the others only as far as cuBLASLt's ld rules need.
  const auto row_multiple = [](LtScaleLayout layout, int64_t minimum) -> int64_t {
    if (layout == LtScaleLayout::Blk128x128) return 128;
    return layout == LtScaleLayout::Vec128 ? std::max<int64_t>(minimum, 4) : minimum;
  };
  p.M_pad = round_up(p.M, row_multiple(g.a.layout, 1));
  p.N_pad = round_up(p.N, row_multiple(g.b.layout, kNAlign));
  p.k_tiles = ceil_div(g.K, g.block_k);
  p.copy_a = p.K_pad != g.K || p.M_pad != p.M || !aligned16(g.a.data);
  p.copy_b = p.K_pad != g.K || p.N_pad != p.N || !aligned16(g.b.data);
  p.a_scales = lt_scale_shape(g.a.layout, p.M_pad, p.k_tiles);  // cuBLASLt's B: M_pad rows
  p.b_scales = lt_scale_shape(g.b.layout, p.N_pad, p.k_tiles);  // cuBLASLt's A: N_pad rows
  size_t offset = kWorkspaceBytes;
  const auto take = [&](bool needed, size_t bytes) {
    const size_t at = offset;
    if (needed) offset += (bytes + 255) / 256 * 256;
    return at;
  };
  const size_t scale_bytes = scale_element_bytes(g.recipe);
  p.a_offset = take(p.copy_a, size_t(p.M_pad * p.K_pad));
  p.b_offset = take(p.copy_b, size_t(p.N_pad * p.K_pad));
  p.a_scales_offset = take(true, size_t(p.a_scales.elements) * scale_bytes);
  p.b_scales_offset = take(true, size_t(p.b_scales.elements) * scale_bytes);
  p.d_offset = take(true, size_t(p.M_pad * p.N_pad) * element_bytes(g.out_type));
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

// out [M, N] = out_t(float(d [M, N_pad]) + bias) in fp32; d == nullptr reads zeros (K == 0). Without
// a bias the value passes unchanged (a 16-bit value converts to float and back exactly).
template <typename out_t>
__global__ void finish_kernel(const out_t* __restrict__ d, int64_t M, int64_t N, int64_t N_pad,
                              const out_t* __restrict__ bias, out_t* __restrict__ out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N; i += stride) {
    const int64_t m = i / N, n = i - m * N;
    float v = d != nullptr ? static_cast<float>(d[m * N_pad + n]) : 0.0f;
    if (bias != nullptr) v = __fadd_rn(v, static_cast<float>(bias[n]));
    out[i] = static_cast<out_t>(v);
  }
}

void finish(const void* d, int64_t M, int64_t N, int64_t N_pad, const void* bias, void* out, HpType out_type,
            cudaStream_t stream) {
  FP8MP_DISPATCH_HP(out_type, [&] {
    finish_kernel<scalar_t><<<blocks_for(M * N), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(d), M, N, N_pad, static_cast<const scalar_t*>(bias), static_cast<scalar_t*>(out));
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

const char* out_type_name(HpType t) {
  return t == HpType::Float32 ? "float32" : (t == HpType::BFloat16 ? "bfloat16" : "float16");
}

// What a cached cuBLASLt plan depends on: everything the descriptor, layouts and heuristic see but the
// scale pointers, which are set on the cached descriptor before each call (as fp8_gemm's plans are:
// gemm_plan_cache.h, whose per-thread reasoning applies here too).
struct BlockPlanKey {
  int device;
  int recipe, a_layout, b_layout, a_format, b_format, out_type;
  int64_t M_pad, N_pad, K_pad;
  uint32_t align_a, align_b, align_d;

  bool operator==(const BlockPlanKey& o) const {
    return device == o.device && recipe == o.recipe && a_layout == o.a_layout && b_layout == o.b_layout &&
           a_format == o.a_format && b_format == o.b_format && out_type == o.out_type && M_pad == o.M_pad &&
           N_pad == o.N_pad && K_pad == o.K_pad && align_a == o.align_a && align_b == o.align_b &&
           align_d == o.align_d;
  }
};

struct BlockPlanKeyHash {
  size_t operator()(const BlockPlanKey& k) const {
    size_t h = std::hash<int64_t>()(k.M_pad);
    const auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
    mix(uint64_t(k.N_pad));
    mix(uint64_t(k.K_pad));
    mix((uint64_t(uint32_t(k.device)) << 32) | (uint64_t(k.recipe) << 24) | (uint64_t(k.a_layout) << 20) |
        (uint64_t(k.b_layout) << 16) | (uint64_t(k.a_format) << 12) | (uint64_t(k.b_format) << 8) |
        uint64_t(k.out_type));
    mix((uint64_t(k.align_a) << 40) | (uint64_t(k.align_b) << 20) | uint64_t(k.align_d));
    return h;
  }
};

void set_scale_pointers(cublasLtMatmulDesc_t desc, const void* a_scales, const void* b_scales) {
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scales);  // cuBLASLt's A is our b
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scales);
}

constexpr size_t kMaxCachedPlans = 1024;  // distinct GEMM configurations per thread before the cache starts over
// Descriptor, layouts and heuristic for `key`, built on first use by this thread (with the first call's
// scale pointers set, as the heuristic query sees them).
GemmPlan build_plan(cublasLtHandle_t handle, const BlockPlanKey& key, const BlockGemmArgs& g, const ScratchPlan& p,
                    const void* a_scales, const void* b_scales, int cc) {
  cublasLtMatmulDesc_t raw_desc = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  GemmPlan plan{};
  plan.desc = MatmulDesc(raw_desc);
  cublasLtMatmulDesc_t desc = plan.desc.get();
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(CUBLAS_OP_T));
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(CUBLAS_OP_N));
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(0));  // promoted accumulation
  // cuBLASLt's A is our b, its B our a.
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_scale_mode(g.b.layout));
  set_matmul_attribute<kOp>(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_scale_mode(g.a.layout));
  set_scale_pointers(desc, a_scales, b_scales);
  plan.a_layout = make_matrix_layout<kOp>(fp8_cuda_type(g.b.format), p.K_pad, p.N_pad, p.K_pad);
  plan.b_layout = make_matrix_layout<kOp>(fp8_cuda_type(g.a.format), p.K_pad, p.M_pad, p.K_pad);
  plan.d_layout = make_matrix_layout<kOp>(cuda_type(g.out_type), p.N_pad, p.M_pad, p.N_pad);

  const Preference pref = make_preference<kOp>(uint64_t(kWorkspaceBytes), key.align_b, key.align_a, key.align_d);

  cublasLtMatmulHeuristicResult_t heuristic{};
  int returned = 0;
  // A configuration cuBLASLt cannot run comes back as NOT_SUPPORTED or as zero results: either way the
  // error says what was asked for, on which GPU and cuBLASLt.
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, desc, plan.a_layout.get(), plan.b_layout.get(),
                                                               plan.d_layout.get(), plan.d_layout.get(), pref.get(), 1,
                                                               &heuristic, &returned);
  if (status != CUBLAS_STATUS_SUCCESS || returned == 0) {
    throw std::runtime_error(std::string(kOp) + ": cuBLASLt " + cublaslt_version_string(cublasLtGetVersion()) +
                             " found no algorithm (" + cublasLtGetStatusName(status) + ", " +
                             std::to_string(returned) + " results) for " + requirement(g.recipe).what + " on cuda:" +
                             std::to_string(key.device) + " (compute capability " + capability_string(cc) + ") with a " +
                             format_name(g.a.format) + " [" + std::to_string(p.M_pad) + ", " + std::to_string(p.K_pad) +
                             "], b " + format_name(g.b.format) + " [" + std::to_string(p.N_pad) + ", " +
                             std::to_string(p.K_pad) + "] (padded) and a " + out_type_name(g.out_type) + " output");
  }
  plan.algo = heuristic.algo;
  return plan;
}

GemmPlan& cached_plan(cublasLtHandle_t handle, const BlockPlanKey& key, const BlockGemmArgs& g, const ScratchPlan& p,
                      const void* a_scales, const void* b_scales, int cc) {
  thread_local std::unordered_map<BlockPlanKey, GemmPlan, BlockPlanKeyHash> cache;
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  GemmPlan built = build_plan(handle, key, g, p, a_scales, b_scales, cc);  // may throw: nothing is cached then
  if (cache.size() >= kMaxCachedPlans) cache.clear();
  return cache.emplace(key, std::move(built)).first->second;
}

}  // namespace

BlockGemmPlanChoice block_gemm_recipe(int64_t K, int64_t a_block_rows, int64_t b_block_rows, int64_t block_k,
                                      bool a_e8m0, bool b_e8m0) {
  const bool fp32_scales = !a_e8m0 && !b_e8m0;
  if (fp32_scales && a_block_rows == 1 && b_block_rows == 1 && block_k >= K) {
    return {BlockGemmRecipe::Rowwise, LtScaleLayout::OuterVec, LtScaleLayout::OuterVec, ""};
  }
  const auto deepseek_rows = [](int64_t r) { return r == 1 || r == 128; };
  if (fp32_scales && block_k == 128 && deepseek_rows(a_block_rows) && deepseek_rows(b_block_rows) &&
      !(a_block_rows == 128 && b_block_rows == 128)) {
    const auto layout = [](int64_t r) { return r == 1 ? LtScaleLayout::Vec128 : LtScaleLayout::Blk128x128; };
    return {BlockGemmRecipe::DeepSeek, layout(a_block_rows), layout(b_block_rows), ""};
  }
  if (a_e8m0 && b_e8m0 && block_k == 32 && a_block_rows == 1 && b_block_rows == 1) {
    return {BlockGemmRecipe::Mxfp8, LtScaleLayout::Vec32Swizzled, LtScaleLayout::Vec32Swizzled, ""};
  }
  const auto dtype = [](bool e8m0) { return e8m0 ? "float8_e8m0fnu" : "float32"; };
  return {BlockGemmRecipe::Rowwise, LtScaleLayout::OuterVec, LtScaleLayout::OuterVec,
          std::string(kOp) +
              ": on CUDA the blocks must be those of a recipe cuBLASLt runs: rowwise (a_block_rows = b_block_rows = 1, "
              "block_k >= K, float32 scales), DeepSeek-V3 (block_k = 128, a_block_rows and b_block_rows 1 or 128, not "
              "both 128, float32 scales) or MXFP8 (a_block_rows = b_block_rows = 1, block_k = 32, float8_e8m0fnu "
              "scales); got a_block_rows = " +
              std::to_string(a_block_rows) + ", b_block_rows = " + std::to_string(b_block_rows) +
              ", block_k = " + std::to_string(block_k) + ", K = " + std::to_string(K) + ", scales " + dtype(a_e8m0) +
              " and " + dtype(b_e8m0)};
}

size_t block_scaled_gemm_scratch_bytes(const BlockGemmArgs& args) {
  if (args.a.rows == 0 || args.b.rows == 0 || args.K == 0) return 0;
  return plan_scratch(args).bytes;
}

void block_scaled_gemm(cublasLtHandle_t handle, const BlockGemmArgs& g, void* scratch, cudaStream_t stream) {
  const int64_t M = g.a.rows, N = g.b.rows;
  if (M == 0 || N == 0) return;
  if (g.K == 0) {  // an empty sum: the result is the bias (or zeros), whatever the scales
    finish(nullptr, M, N, N, g.bias, g.out, g.out_type, stream);
    return;
  }
  int device = 0;
  FP8MP_CUDA_CHECK(cudaGetDevice(&device));
  const int cc = current_compute_capability(device);
  check_device_and_cublaslt(g.recipe, device, cc);
  const ScratchPlan p = plan_scratch(g);
  uint8_t* base = static_cast<uint8_t*>(scratch);
  const uint8_t* a_p = padded_codes(g.a, p.copy_a, g.K, p.M_pad, p.K_pad, base + p.a_offset, stream);
  const uint8_t* b_p = padded_codes(g.b, p.copy_b, g.K, p.N_pad, p.K_pad, base + p.b_offset, stream);
  void* a_scales = base + p.a_scales_offset;
  void* b_scales = base + p.b_scales_offset;
  rearrange_scales(g.a, g.recipe, p.k_tiles, p.a_scales, a_scales, stream);
  rearrange_scales(g.b, g.recipe, p.k_tiles, p.b_scales, b_scales, stream);
  void* d = base + p.d_offset;

  const BlockPlanKey key{device,          int(g.recipe),   int(g.a.layout),        int(g.b.layout),
                         int(g.a.format),  int(g.b.format), int(g.out_type),        p.M_pad,
                         p.N_pad,          p.K_pad,         pointer_alignment(a_p), pointer_alignment(b_p),
                         pointer_alignment(d)};
  GemmPlan& plan = cached_plan(handle, key, g, p, a_scales, b_scales, cc);
  set_scale_pointers(plan.desc.get(), a_scales, b_scales);  // this call's, on this thread's cached descriptor
  const float alpha = 1.0f, beta = 0.0f;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmul(handle, plan.desc.get(), &alpha, b_p, plan.a_layout.get(), a_p,
                                      plan.b_layout.get(), &beta, d, plan.d_layout.get(), d, plan.d_layout.get(),
                                      &plan.algo, base, kWorkspaceBytes, stream));
  finish(d, M, N, p.N_pad, g.bias, g.out, g.out_type, stream);
}

}  // namespace fp8mp::cuda
