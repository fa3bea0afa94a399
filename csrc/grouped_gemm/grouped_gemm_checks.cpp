#include "grouped_gemm/grouped_gemm_checks.h"

#include <vector>

namespace fp8mp {
namespace {

constexpr int64_t kAlign = 16;

GroupedGemmFormats check_operands(const Tensor& a, const Tensor& b, const char* op) {
  const GroupedGemmFormats formats{format_of(a, op, "a"), format_of(b, op, "b")};
  FP8MP_CHECK(!(formats.a == Fp8Format::E5M2 && formats.b == Fp8Format::E5M2), op,
              ": arguments 'a' and 'b' cannot both be float8_e5m2 (cuBLASLt has no e5m2 x e5m2 FP8 GEMM); "
              "make at least one of them float8_e4m3fn");
  FP8MP_CHECK(same_device(b, a), op, ": argument 'b' must be on the device of 'a' ", device_str(a), ", got ",
              device_str(b));
  return formats;
}

void check_offs(const Tensor& offs, const Tensor& a, const char* op) {
  FP8MP_CHECK(offs.scalar_type() == ScalarType::Int, op, ": argument 'offs' must be int32, got ",
              dtype_str(offs.scalar_type()));
  // On the CPU beside a CUDA input too: host offsets spare the CUDA op its device-to-host copy and sync.
  FP8MP_CHECK(same_device(offs, a) || offs.is_cpu(), op, ": argument 'offs' must be on the input's device ",
              device_str(a), " or on the CPU, got ", device_str(offs));
  FP8MP_CHECK_VALUE(offs.dim() == 1 && offs.size(0) >= 1, op,
                    ": argument 'offs' must be 1-D [G] with G >= 1 (the groups' cumulative ends), got shape ",
                    shape_str(offs));
}

void check_multiple_of_16(int64_t size, const char* op, const char* arg, const char* what) {
  FP8MP_CHECK_VALUE(size % kAlign == 0, op, ": argument '", arg, "' must have ", what,
                    " a multiple of 16 (cuBLASLt's FP8 alignment), got ", size);
}

// a [M, K] and b [G, N, K] with G = offs.size(0), K and N multiples of 16, bias [G, N]: the M-grouped GEMMs' shapes.
void check_m_grouped_shapes(const Tensor& a, const Tensor& b, const Tensor& offs, const std::optional<Tensor>& bias,
                            ScalarType out_dtype, const char* op) {
  check_offs(offs, a, op);
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  FP8MP_CHECK_VALUE(a.dim() == 2, op, ": argument 'a' must be 2-D [M, K], got shape ", shape_str(a));
  FP8MP_CHECK_VALUE(b.dim() == 3, op, ": argument 'b' must be 3-D [G, N, K], got shape ", shape_str(b));
  const int64_t G = offs.size(0);
  FP8MP_CHECK_VALUE(b.size(0) == G, op, ": argument 'b' must have one matrix per group, G = offs.size(0) = ", G,
                    ", got shape ", shape_str(b));
  FP8MP_CHECK_VALUE(b.size(2) == a.size(1), op, ": argument 'b' must be [G, N, K] with K = a.size(1) = ", a.size(1),
                    " (out = a @ b[g].T), got shape ", shape_str(b));
  check_multiple_of_16(a.size(1), op, "a", "K = a.size(1)");
  check_multiple_of_16(b.size(1), op, "b", "N = b.size(1)");
  if (!bias.has_value()) return;
  const Tensor& t = *bias;
  check_bias_dtype_and_device(t, a, out_dtype, op);
  FP8MP_CHECK_VALUE(t.dim() == 2 && t.size(0) == G && t.size(1) == b.size(1), op,
                    ": argument 'bias' must have shape [G, N] = [", G, ", ", b.size(1), "], got shape ", shape_str(t));
}

// a [N, T] and b [K, T], offs along T, N and K multiples of 16: the K-grouped GEMMs' shapes.
void check_k_grouped_shapes(const Tensor& a, const Tensor& b, const Tensor& offs, ScalarType out_dtype, const char* op) {
  check_offs(offs, a, op);
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  FP8MP_CHECK_VALUE(a.dim() == 2, op, ": argument 'a' must be 2-D [N, T], got shape ", shape_str(a));
  FP8MP_CHECK_VALUE(b.dim() == 2, op, ": argument 'b' must be 2-D [K, T], got shape ", shape_str(b));
  FP8MP_CHECK_VALUE(b.size(1) == a.size(1), op, ": argument 'b' must be [K, T] with T = a.size(1) = ", a.size(1),
                    " (out[g] = a[:, group g] @ b[:, group g].T), got shape ", shape_str(b));
  check_multiple_of_16(a.size(0), op, "a", "N = a.size(0)");
  check_multiple_of_16(b.size(0), op, "b", "K = b.size(0)");
}

// A block scale_inv: float32 or float8_e8m0fnu on a's device, of shape `expected`.
void check_block_scale_tensor(const Tensor& scale_inv, const Tensor& a, const std::vector<int64_t>& expected,
                              const char* what, const char* op, const char* arg) {
  FP8MP_CHECK(scale_inv.scalar_type() == kFloat || scale_inv.scalar_type() == ScalarType::Float8_e8m0fnu, op,
              ": argument '", arg, "' must be float32 or float8_e8m0fnu, got ", dtype_str(scale_inv.scalar_type()));
  FP8MP_CHECK(same_device(scale_inv, a), op, ": argument '", arg, "' must be on the input's device ", device_str(a),
              ", got ", device_str(scale_inv));
  FP8MP_CHECK_VALUE(sizes_of(scale_inv) == expected, op, ": argument '", arg, "' must have shape ", shape_str(expected),
                    " (", what, "), got shape ", shape_str(scale_inv));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

GroupedGemmFormats check_fp8_grouped_gemm_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                               const Tensor& b_scale_inv, const Tensor& offs,
                                               const std::optional<Tensor>& bias, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::fp8_grouped_gemm";
  const GroupedGemmFormats formats = check_operands(a, b, op);
  check_scalar_tensor(a_scale_inv, a, op, "a_scale_inv");
  check_m_grouped_shapes(a, b, offs, bias, out_dtype, op);
  const int64_t G = offs.size(0);
  FP8MP_CHECK(b_scale_inv.scalar_type() == kFloat, op, ": argument 'b_scale_inv' must be a float32 tensor, got dtype ",
              dtype_str(b_scale_inv.scalar_type()));
  FP8MP_CHECK(same_device(b_scale_inv, a), op, ": argument 'b_scale_inv' must be on the input's device ",
              device_str(a), ", got ", device_str(b_scale_inv));
  FP8MP_CHECK_VALUE(b_scale_inv.dim() == 1 && b_scale_inv.size(0) == G, op,
                    ": argument 'b_scale_inv' must be [G] = [", G, "] (one scale per group's matrix), got shape ",
                    shape_str(b_scale_inv));
  return formats;
}

GroupedGemmFormats check_block_scaled_grouped_gemm_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                                        const Tensor& b_scale_inv, const Tensor& offs,
                                                        int64_t a_block_rows, int64_t b_block_rows, int64_t block_k,
                                                        const std::optional<Tensor>& bias, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::block_scaled_grouped_gemm";
  const GroupedGemmFormats formats = check_operands(a, b, op);
  check_m_grouped_shapes(a, b, offs, bias, out_dtype, op);
  FP8MP_CHECK_VALUE(a_block_rows == 1, op, ": argument 'a_block_rows' must be 1 (1 x block_k blocks, so that no ",
                    "block of a spans two groups), got ", a_block_rows);
  FP8MP_CHECK_VALUE(b_block_rows >= 1, op, ": argument 'b_block_rows' must be >= 1, got ", b_block_rows);
  FP8MP_CHECK_VALUE(block_k >= 1, op, ": argument 'block_k' must be >= 1, got ", block_k);
  const int64_t chunks = ceil_div(a.size(1), block_k);
  check_block_scale_tensor(a_scale_inv, a, {a.size(0), chunks}, "one scale per row and K block", op, "a_scale_inv");
  check_block_scale_tensor(b_scale_inv, a, {b.size(0), ceil_div(b.size(1), b_block_rows), chunks},
                           "one scale per group, b_block_rows x block_k block", op, "b_scale_inv");
  return formats;
}

GroupedGemmFormats check_fp8_grouped_gemm_wgrad_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                                     const Tensor& b_scale_inv, const Tensor& offs,
                                                     ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::fp8_grouped_gemm_wgrad";
  const GroupedGemmFormats formats = check_operands(a, b, op);
  check_scalar_tensor(a_scale_inv, a, op, "a_scale_inv");
  check_scalar_tensor(b_scale_inv, a, op, "b_scale_inv");
  check_k_grouped_shapes(a, b, offs, out_dtype, op);
  return formats;
}

BlockWgradShape check_block_scaled_grouped_gemm_wgrad_args(const Tensor& a, const Tensor& a_scale_inv,
                                                           const Tensor& b, const Tensor& b_scale_inv,
                                                           const Tensor& offs, int64_t block_k, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::block_scaled_grouped_gemm_wgrad";
  const GroupedGemmFormats formats = check_operands(a, b, op);
  check_k_grouped_shapes(a, b, offs, out_dtype, op);
  FP8MP_CHECK_VALUE(block_k >= 1, op, ": argument 'block_k' must be >= 1, got ", block_k);
  FP8MP_CHECK_VALUE(a_scale_inv.dim() == 2, op, ": argument 'a_scale_inv' must be 2-D [N, C] (the groups' chunks), ",
                    "got shape ", shape_str(a_scale_inv));
  const int64_t chunks = a_scale_inv.size(1);
  check_block_scale_tensor(a_scale_inv, a, {a.size(0), chunks}, "one scale per row and group chunk", op,
                           "a_scale_inv");
  check_block_scale_tensor(b_scale_inv, a, {b.size(0), chunks}, "one scale per row and group chunk, as a_scale_inv",
                           op, "b_scale_inv");
  return {formats, a.size(0), b.size(0), a.size(1), offs.size(0), chunks};
}

void check_group_chunks(const int32_t* offs, int64_t groups, int64_t block_k, int64_t chunks, const char* op) {
  int64_t expected = 0, start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    expected += ceil_div(offs[g] - start, block_k);
    start = offs[g];
  }
  FP8MP_CHECK_VALUE(chunks == expected, op, ": argument 'a_scale_inv' must have C = ", expected,
                    " columns (the groups' chunks, ceil(T_g / block_k) each, for these offs), got ", chunks);
}

void check_group_offsets(const int32_t* offs, int64_t groups, int64_t total, const char* total_name, const char* op) {
  int64_t previous = 0;
  for (int64_t g = 0; g < groups; ++g) {
    FP8MP_CHECK_VALUE(offs[g] >= previous, op, ": argument 'offs' must be non-decreasing and >= 0 (cumulative ends ",
                      "of the groups), got offs[", g, "] = ", offs[g], " after ", previous);
    previous = offs[g];
  }
  FP8MP_CHECK_VALUE(previous == total, op, ": argument 'offs' must end at ", total_name, " = ", total,
                    " (every token in a group), got offs[", groups - 1, "] = ", previous);
}

}  // namespace fp8mp
