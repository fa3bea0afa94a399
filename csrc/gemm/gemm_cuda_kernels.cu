// CUDA implementation of fp8_gemm with cuBLASLt (Ada sm_89 / Hopper sm_90 and later).
//
// out [M, N] = a [M, K] @ b [N, K]^T, both row-major. cuBLASLt is column-major,
// so the row-major out is a column-major out^T [N, M], computed as
//   out^T = op(A) * op(B) with A = b (stored K x N column-major, ld = K, op = T)
//                          and B = a (stored K x M column-major, ld = K, op = N),
// the "TN" layout, the only one cuBLASLt supports for FP8 (both operands
// K-major). A's scale is therefore b_scale_inv and B's is a_scale_inv.
//
// cuBLASLt multiplies the FP8 values exactly, accumulates in fp32 (periodically
// promoted unless use_fast_accum), applies alpha = scale_a * scale_b and the
// bias in an fp32 epilogue and rounds once to the output type: the arithmetic
// gemm_cpu.cpp emulates. The bias epilogue takes a bias of the output type for
// bf16/fp16 outputs; for fp32 outputs it wants a bf16 bias, which would round
// ours, so an fp32 bias is added after the GEMM instead (same fp32 arithmetic).
//
// FP8 cuBLASLt needs the leading dimensions K (of a and b) and N (of out) to be
// multiples of 16 and 16-byte aligned operands. Other shapes are zero-padded:
// extra K columns of zero codes add exact zeros to every dot product, and extra
// rows of b (N) produce output columns that are dropped. Each padded operand is
// written once, by one kernel (values and zeros together); a padded output
// costs one strided copy back. So every shape works; aligned shapes pay nothing.
//
// cuBLASLt is told the real alignment of every operand
// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES; it otherwise assumes 256 bytes
// and may pick a kernel that faults on a 16-byte-aligned view), and the
// descriptor, layouts and chosen algorithm are cached per configuration
// (gemm_plan_cache.h), the heuristic asked once per power-of-two bucket of M and K
// (heuristic_shape.h: the grouped GEMMs' per-expert sizes change every step).
#include "gemm/gemm_cuda_kernels.cuh"

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "common/cuda_check.cuh"
#include "gemm/cublaslt_helpers.h"
#include "gemm/gemm_plan_cache.h"
#include "gemm/heuristic_shape.h"

namespace fp8mp::cuda {
namespace {

constexpr char kOp[] = "fp8mp::fp8_gemm";
constexpr int64_t kAlign = 16;                             // cuBLASLt FP8: K and N multiples of 16
constexpr size_t kWorkspaceBytes = size_t(32) << 20;       // what cuBLASLt's Hopper kernels like

template <typename V>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  set_matmul_attribute<kOp>(desc, attr, value);
}

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  return make_matrix_layout<kOp>(type, rows, cols, ld);
}

cudaDataType_t cuda_type(HpType type) {
  switch (type) {
    case HpType::Float32: return CUDA_R_32F;
    case HpType::BFloat16: return CUDA_R_16BF;
    default: return CUDA_R_16F;
  }
}

size_t element_size(HpType type) { return type == HpType::Float32 ? 4 : 2; }

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The buffers of one call, K and N padded to kAlign; each copy is placed in
// the scratch only when the caller's buffer cannot be used as it is.
struct Plan {
  int64_t K_pad, N_pad;
  bool copy_a, copy_b, copy_out, epilogue_bias, copy_bias;
  size_t a_offset, b_offset, out_offset, bias_offset, bytes;
};

Plan plan(const Fp8GemmArgs& g) {
  Plan p{};
  p.K_pad = round_up(g.K, kAlign);
  p.N_pad = round_up(g.N, kAlign);
  p.copy_a = p.K_pad != g.K || !aligned16(g.a);
  p.copy_b = p.K_pad != g.K || p.N_pad != g.N || !aligned16(g.b);
  p.copy_out = p.N_pad != g.N;
  // Bias in the epilogue for bf16/fp16 outputs (the type cuBLASLt wants there);
  // an fp32 bias is added after the GEMM (see the top of the file).
  p.epilogue_bias = g.bias != nullptr && g.out_type != HpType::Float32;
  p.copy_bias = p.epilogue_bias && (p.N_pad != g.N || !aligned16(g.bias));
  size_t offset = kWorkspaceBytes;
  const auto take = [&](bool needed, size_t bytes) {
    const size_t at = offset;
    if (needed) offset += (bytes + 255) / 256 * 256;
    return at;
  };
  p.a_offset = take(p.copy_a, size_t(g.M * p.K_pad));
  p.b_offset = take(p.copy_b, size_t(p.N_pad * p.K_pad));
  p.out_offset = take(p.copy_out, size_t(g.M * p.N_pad) * element_size(g.out_type));
  p.bias_offset = take(p.copy_bias, size_t(p.N_pad) * element_size(g.out_type));
  p.bytes = offset;
  return p;
}

// dst [dst_rows, dst_cols] (bytes, dst 16-byte aligned, dst_cols % 16 == 0) = src [rows, cols]
// in its top-left corner, zeros elsewhere: every byte of dst written once, 16 at a time.
__global__ void pad_bytes_kernel(const uint8_t* __restrict__ src, int64_t rows, int64_t cols,
                                 uint8_t* __restrict__ dst, int64_t dst_rows, int64_t dst_cols) {
  const int64_t chunks_per_row = dst_cols / 16;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < dst_rows * chunks_per_row; i += stride) {
    const int64_t r = i / chunks_per_row, c0 = (i % chunks_per_row) * 16;
    alignas(16) uint8_t chunk[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) chunk[k] = (r < rows && c0 + k < cols) ? src[r * cols + c0 + k] : uint8_t(0);
    *reinterpret_cast<uint4*>(dst + r * dst_cols + c0) = *reinterpret_cast<const uint4*>(chunk);
  }
}

// out[m, n] += bias[n] in fp32 (the bias of an fp32 output).
__global__ void add_bias_kernel(float* __restrict__ out, const float* __restrict__ bias, int64_t M, int64_t N) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N; i += stride) {
    out[i] = __fadd_rn(out[i], bias[i % N]);
  }
}

// out [M, N] (rows of row_bytes bytes) = bias repeated on every row.
__global__ void repeat_row_kernel(uint8_t* __restrict__ out, const uint8_t* __restrict__ row, int64_t total,
                                  int64_t row_bytes) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) out[i] = row[i % row_bytes];
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t items) {
  const int64_t max_blocks = int64_t(current_device_sm_count()) * 8;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, max_blocks)));
}

void pad_bytes(const void* src, int64_t rows, int64_t cols, void* dst, int64_t dst_rows, int64_t dst_cols,
               cudaStream_t stream) {
  pad_bytes_kernel<<<blocks_for(dst_rows * (dst_cols / 16)), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(src), rows, cols, static_cast<uint8_t*>(dst), dst_rows, dst_cols);
  FP8MP_CUDA_LAUNCH_CHECK();
}

// A GPU this build holds code for (device_support.h: not, e.g., an sm_110 Jetson Thor) with FP8 tensor cores.
void check_fp8_capable_device() {
  const DeviceDescription gpu = current_device_description();
  check_device_code(gpu, kOp);
  if (gpu.compute_capability < 89) {
    throw std::runtime_error(std::string(kOp) + ": FP8 GEMM needs a GPU of compute capability 8.9 or newer; " +
                             gpu.text());
  }
}

// The pointers of one call that live on the descriptor rather than in the key.
struct CallPointers {
  const float* a_scale_inv;
  const float* b_scale_inv;
  const void* bias;  // the epilogue's, or nullptr
};

void set_call_pointers(cublasLtMatmulDesc_t desc, const CallPointers& ptrs) {
  set_attribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(ptrs.b_scale_inv));  // A is b
  set_attribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(ptrs.a_scale_inv));
  if (ptrs.bias != nullptr) set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ptrs.bias);
}

// An algorithm, or none (nvcc 13's front end fails on a std::optional of cuBLASLt's algorithm struct).
struct MaybeAlgo {
  bool found;
  cublasLtMatmulAlgo_t algo;
};

// The heuristic's first algorithm for `desc` over these layouts, or none when it has none.
MaybeAlgo query_heuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                    cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                    cublasLtMatrixLayout_t d, const GemmPlanKey& key) {
  // cuBLASLt's A is our b.
  const Preference pref = make_preference<kOp>(uint64_t(kWorkspaceBytes), key.align_b, key.align_a, key.align_out);
  cublasLtMatmulHeuristicResult_t heuristic{};
  int returned = 0;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref.get(), 1, &heuristic, &returned));
  return {returned > 0, heuristic.algo};
}

// The algorithm of the power-of-two bucket of (M, K_pad) (heuristic_shape.h), asked about once per bucket and
// thread, with the layouts of the bucket's sizes and the first call's descriptor; nothing when the heuristic
// has none for the bucket.
MaybeAlgo bucket_algo(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                const GemmPlanKey& key) {
  GemmPlanKey bucket = key;
  bucket.M = heuristic_extent(key.M);
  bucket.K_pad = heuristic_extent(key.K_pad);
  thread_local std::unordered_map<GemmPlanKey, MaybeAlgo, GemmPlanKeyHash> algos;
  const auto found = algos.find(bucket);
  if (found != algos.end()) return found->second;
  const Layout a = make_layout(cudaDataType_t(key.b_type), bucket.K_pad, key.N_pad, bucket.K_pad);
  const Layout b = make_layout(cudaDataType_t(key.a_type), bucket.K_pad, bucket.M, bucket.K_pad);
  const Layout d = make_layout(cudaDataType_t(key.out_type), key.N_pad, bucket.M, key.N_pad);
  const MaybeAlgo algo = query_heuristic(handle, desc, a.get(), b.get(), d.get(), bucket);
  if (algos.size() >= 1024) algos.clear();
  algos.emplace(bucket, algo);
  return algo;
}

// Descriptor, layouts and algorithm for `key`, built on first use by this thread (with the first call's pointers
// set, as the heuristic query sees them). The algorithm is the bucket's where cublasLtMatmulAlgoCheck accepts it
// for these exact layouts within the workspace, else the heuristic's for the exact sizes.
GemmPlan build_plan(cublasLtHandle_t handle, const GemmPlanKey& key, const CallPointers& ptrs) {
  GemmPlan plan_{};
  cublasLtMatmulDesc_t raw_desc = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  plan_.desc = MatmulDesc(raw_desc);
  cublasLtMatmulDesc_t desc = plan_.desc.get();
  set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(CUBLAS_OP_T));
  set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(CUBLAS_OP_N));
  set_attribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(key.fast_accum ? 1 : 0));
  set_call_pointers(desc, ptrs);
  if (key.epilogue_bias) {
    set_attribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, cublasLtEpilogue_t(CUBLASLT_EPILOGUE_BIAS));
    set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(key.out_type));
  }
  // Column-major view: A = b (K x N_pad), B = a (K x M), C = D = out^T (N_pad x M).
  plan_.a_layout = make_layout(cudaDataType_t(key.b_type), key.K_pad, key.N_pad, key.K_pad);
  plan_.b_layout = make_layout(cudaDataType_t(key.a_type), key.K_pad, key.M, key.K_pad);
  plan_.d_layout = make_layout(cudaDataType_t(key.out_type), key.N_pad, key.M, key.N_pad);

  MaybeAlgo algo = bucket_algo(handle, desc, key);
  algo.found = algo.found && algo_accepted(handle, desc, plan_.a_layout.get(), plan_.b_layout.get(),
                                           plan_.d_layout.get(), algo.algo, kWorkspaceBytes);
  if (!algo.found) {
    algo = query_heuristic(handle, desc, plan_.a_layout.get(), plan_.b_layout.get(), plan_.d_layout.get(), key);
  }
  if (!algo.found) {
    throw std::runtime_error(std::string(kOp) + ": cuBLASLt found no algorithm for an FP8 GEMM with M=" +
                             std::to_string(key.M) + ", padded K=" + std::to_string(key.K_pad) + ", N=" +
                             std::to_string(key.N_pad) + ", bias epilogue " + std::to_string(key.epilogue_bias) +
                             ", operand alignments " + std::to_string(key.align_a) + "/" +
                             std::to_string(key.align_b) + "/" + std::to_string(key.align_out) + " bytes");
  }
  plan_.algo = algo.algo;
  return plan_;
}

constexpr size_t kMaxCachedPlans = 1024;  // distinct GEMM shapes per thread before the cache starts over

GemmPlan& cached_plan(cublasLtHandle_t handle, const GemmPlanKey& key, const CallPointers& ptrs) {
  thread_local std::unordered_map<GemmPlanKey, GemmPlan, GemmPlanKeyHash> cache;
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  GemmPlan built = build_plan(handle, key, ptrs);  // may throw: nothing is cached then
  if (cache.size() >= kMaxCachedPlans) cache.clear();
  return cache.emplace(key, std::move(built)).first->second;
}

}  // namespace

cublasLtHandle_t blaslt_handle_for_current_device() {
  constexpr int kMaxDevices = 64;
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  static std::mutex mutex;
  int device = 0;
  FP8MP_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kMaxDevices) throw std::runtime_error(std::string(kOp) + ": device index too large for fp8mp");
  const std::lock_guard<std::mutex> lock(mutex);
  if (handles[device] == nullptr) FP8MP_CUBLASLT_CHECK(cublasLtCreate(&handles[device]));
  return handles[device];
}

size_t fp8_gemm_scratch_bytes(const Fp8GemmArgs& args) {
  if (args.M == 0 || args.N == 0 || args.K == 0) return 0;
  return plan(args).bytes;
}

void fp8_gemm(cublasLtHandle_t handle, const Fp8GemmArgs& g, void* scratch, cudaStream_t stream) {
  const int64_t M = g.M, K = g.K, N = g.N;
  if (M == 0 || N == 0) return;
  const size_t out_row_bytes = size_t(N) * element_size(g.out_type);
  if (K == 0) {  // an empty sum: the result is the bias (or zeros), whatever the scales
    if (g.bias == nullptr) {
      FP8MP_CUDA_CHECK(cudaMemsetAsync(g.out, 0, size_t(M) * out_row_bytes, stream));
    } else {
      const int64_t total = M * int64_t(out_row_bytes);
      repeat_row_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
          static_cast<uint8_t*>(g.out), static_cast<const uint8_t*>(g.bias), total, int64_t(out_row_bytes));
      FP8MP_CUDA_LAUNCH_CHECK();
    }
    return;
  }
  check_fp8_capable_device();
  const Plan p = plan(g);
  uint8_t* base = static_cast<uint8_t*>(scratch);
  const size_t esize = element_size(g.out_type);
  const void* a_p = g.a;
  if (p.copy_a) {
    pad_bytes(g.a, M, K, base + p.a_offset, M, p.K_pad, stream);
    a_p = base + p.a_offset;
  }
  const void* b_p = g.b;
  if (p.copy_b) {
    pad_bytes(g.b, N, K, base + p.b_offset, p.N_pad, p.K_pad, stream);
    b_p = base + p.b_offset;
  }
  void* out_p = p.copy_out ? base + p.out_offset : g.out;
  const void* bias_p = g.bias;
  if (p.copy_bias) {
    pad_bytes(g.bias, 1, N * int64_t(esize), base + p.bias_offset, 1, round_up(p.N_pad * int64_t(esize), 16), stream);
    bias_p = base + p.bias_offset;
  }

  int device = 0;
  FP8MP_CUDA_CHECK(cudaGetDevice(&device));
  const GemmPlanKey key{device,
                        M,
                        p.N_pad,
                        p.K_pad,
                        int(fp8_cuda_type(g.a_format)),
                        int(fp8_cuda_type(g.b_format)),
                        int(cuda_type(g.out_type)),
                        p.epilogue_bias,
                        g.use_fast_accum,
                        pointer_alignment(a_p),
                        pointer_alignment(b_p),
                        pointer_alignment(out_p)};
  const CallPointers ptrs{g.a_scale_inv, g.b_scale_inv, p.epilogue_bias ? bias_p : nullptr};
  GemmPlan& plan_ = cached_plan(handle, key, ptrs);
  set_call_pointers(plan_.desc.get(), ptrs);  // on this thread's cached descriptor, read by cublasLtMatmul at enqueue
  const float alpha = 1.0f, beta = 0.0f;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmul(handle, plan_.desc.get(), &alpha, b_p, plan_.a_layout.get(), a_p,
                                      plan_.b_layout.get(), &beta, out_p, plan_.d_layout.get(), out_p,
                                      plan_.d_layout.get(), &plan_.algo, base, kWorkspaceBytes, stream));

  if (p.copy_out) {
    FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(g.out, out_row_bytes, out_p, size_t(p.N_pad) * esize,
                                       out_row_bytes, size_t(M), cudaMemcpyDeviceToDevice, stream));
  }
  if (g.bias != nullptr && !p.epilogue_bias) {
    add_bias_kernel<<<blocks_for(M * N), kThreads, 0, stream>>>(static_cast<float*>(g.out),
                                                              static_cast<const float*>(g.bias), M, N);
    FP8MP_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace fp8mp::cuda
