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
// multiples of 16. Other shapes are zero-padded: extra K columns of zero codes
// add exact zeros to every dot product, and extra rows of b (N) produce output
// columns that are sliced off. So every shape works; aligned shapes pay nothing.
#include "gemm/gemm_cuda_kernels.cuh"

#include <algorithm>
#include <array>
#include <mutex>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/cuda_check.cuh"

namespace fp8mp::cuda {
namespace {

constexpr const char* kOp = "fp8mp::fp8_gemm";
constexpr int64_t kAlign = 16;                             // cuBLASLt FP8: K and N multiples of 16
constexpr size_t kWorkspaceBytes = size_t(32) << 20;       // what cuBLASLt's Hopper kernels like

#define FP8MP_CUBLASLT_CHECK(EXPR)                                                                              \
  do {                                                                                                          \
    const cublasStatus_t fp8mp_status_ = (EXPR);                                                                \
    if (fp8mp_status_ != CUBLAS_STATUS_SUCCESS) {                                                               \
      throw std::runtime_error(std::string(kOp) + ": " #EXPR " failed with " +                                  \
                               cublasLtGetStatusName(fp8mp_status_) + " (" + std::to_string(int(fp8mp_status_)) + \
                               "): " + cublasLtGetStatusString(fp8mp_status_));                                 \
    }                                                                                                           \
  } while (0)

// Owning wrappers, so that a failed check does not leak cuBLASLt descriptors.
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t d) const { cublasLtMatrixLayoutDestroy(d); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDeleter>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using Preference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

template <typename V>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&raw, type, uint64_t(rows), uint64_t(cols), ld));
  return Layout(raw);
}

cudaDataType_t fp8_cuda_type(Fp8Format format) { return format == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

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

// dst [rows, dst_cols] (bytes) = src [rows, src_cols] in its top-left corner, zeros elsewhere.
void copy_padded(const void* src, int64_t rows, int64_t src_cols, void* dst, int64_t dst_cols, cudaStream_t stream) {
  if (dst_cols != src_cols) FP8MP_CUDA_CHECK(cudaMemsetAsync(dst, 0, size_t(rows * dst_cols), stream));
  if (rows == 0 || src_cols == 0) return;
  FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(dst_cols), src, size_t(src_cols), size_t(src_cols), size_t(rows),
                                     cudaMemcpyDeviceToDevice, stream));
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

void check_fp8_capable_device() {
  int device = 0, major = 0, minor = 0;
  FP8MP_CUDA_CHECK(cudaGetDevice(&device));
  FP8MP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FP8MP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major * 10 + minor < 89) {
    throw std::runtime_error(std::string(kOp) + ": FP8 GEMM needs a GPU of compute capability 8.9 or newer, cuda:" +
                             std::to_string(device) + " is " + std::to_string(major) + "." + std::to_string(minor));
  }
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
  const void* a_p = g.a;
  if (p.copy_a) {
    copy_padded(g.a, M, K, base + p.a_offset, p.K_pad, stream);
    a_p = base + p.a_offset;
  }
  const void* b_p = g.b;
  if (p.copy_b) {
    FP8MP_CUDA_CHECK(cudaMemsetAsync(base + p.b_offset, 0, size_t(p.N_pad * p.K_pad), stream));
    copy_padded(g.b, N, K, base + p.b_offset, p.K_pad, stream);
    b_p = base + p.b_offset;
  }
  void* out_p = p.copy_out ? base + p.out_offset : g.out;
  const void* bias_p = g.bias;
  if (p.copy_bias) {
    const size_t esize = element_size(g.out_type);
    FP8MP_CUDA_CHECK(cudaMemsetAsync(base + p.bias_offset, 0, size_t(p.N_pad) * esize, stream));
    FP8MP_CUDA_CHECK(cudaMemcpyAsync(base + p.bias_offset, g.bias, size_t(N) * esize, cudaMemcpyDeviceToDevice, stream));
    bias_p = base + p.bias_offset;
  }
  const cudaDataType_t out_type = cuda_type(g.out_type);

  cublasLtMatmulDesc_t raw_desc = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(CUBLAS_OP_T));
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(CUBLAS_OP_N));
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.b_scale_inv));
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.a_scale_inv));
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(g.use_fast_accum ? 1 : 0));
  if (p.epilogue_bias) {
    set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, cublasLtEpilogue_t(CUBLASLT_EPILOGUE_BIAS));
    set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_p);
    set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(out_type));
  }

  // Column-major view: A = b (K x N_pad), B = a (K x M), C = D = out^T (N_pad x M).
  const Layout a_layout = make_layout(fp8_cuda_type(g.b_format), p.K_pad, p.N_pad, p.K_pad);
  const Layout b_layout = make_layout(fp8_cuda_type(g.a_format), p.K_pad, M, p.K_pad);
  const Layout d_layout = make_layout(out_type, p.N_pad, M, p.N_pad);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
  const Preference pref(raw_pref);
  const uint64_t workspace_bytes = kWorkspaceBytes;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes, sizeof(workspace_bytes)));

  cublasLtMatmulHeuristicResult_t heuristic{};
  int returned = 0;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc.get(), a_layout.get(), b_layout.get(),
                                                      d_layout.get(), d_layout.get(), pref.get(), 1, &heuristic,
                                                      &returned));
  if (returned == 0) {
    throw std::runtime_error(std::string(kOp) + ": cuBLASLt found no algorithm for a [" + std::to_string(M) + ", " +
                             std::to_string(K) + "] x [" + std::to_string(N) + ", " + std::to_string(K) +
                             "]^T FP8 GEMM (padded to K=" + std::to_string(p.K_pad) + ", N=" +
                             std::to_string(p.N_pad) + ", bias epilogue " + std::to_string(p.epilogue_bias) + ")");
  }
  const float alpha = 1.0f, beta = 0.0f;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmul(handle, desc.get(), &alpha, b_p, a_layout.get(), a_p, b_layout.get(), &beta,
                                      out_p, d_layout.get(), out_p, d_layout.get(), &heuristic.algo, base,
                                      kWorkspaceBytes, stream));

  if (p.copy_out) {
    FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(g.out, out_row_bytes, out_p, size_t(p.N_pad) * element_size(g.out_type),
                                       out_row_bytes, size_t(M), cudaMemcpyDeviceToDevice, stream));
  }
  if (g.bias != nullptr && !p.epilogue_bias) {
    add_bias_kernel<<<blocks_for(M * N), kThreads, 0, stream>>>(static_cast<float*>(g.out),
                                                              static_cast<const float*>(g.bias), M, N);
    FP8MP_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace fp8mp::cuda
