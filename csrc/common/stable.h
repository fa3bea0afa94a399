// Conventions of fp8mp's torch glue on the LibTorch stable ABI (torch/csrc/stable,
// torch/headeronly): the types it uses, how it reports errors, and the dtype /
// device / shape helpers every op family shares. The glue includes this header
// instead of ATen; the torch-free kernels include neither.
//
// Errors. A C++ exception thrown by a stable-ABI kernel reaches Python as a
// RuntimeError (torch 2.15 maps every exception crossing the stable shim to
// RuntimeError, so std::invalid_argument cannot carry ValueError across
// versions). fp8mp's contract is kept in the message instead:
//   FP8MP_CHECK(cond, parts...)        the wrong kind of tensor (dtype, device,
//                                      layout, aliasing): RuntimeError;
//   FP8MP_CHECK_VALUE(cond, parts...)  a wrong shape or value: the message starts
//                                      with kValueErrorTag, and fp8mp.ops
//                                      (errors.py) re-raises it as ValueError.
// Messages start with the op's name and name the argument.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/cpu_parallel.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using Device = torch::stable::Device;

constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kByte = ScalarType::Byte;
constexpr ScalarType kFloat8_e4m3fn = ScalarType::Float8_e4m3fn;
constexpr ScalarType kFloat8_e5m2 = ScalarType::Float8_e5m2;

constexpr const char* kValueErrorTag = "[ValueError] ";

template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

#define FP8MP_CHECK(COND, ...)                                                  \
  do {                                                                          \
    if (!(COND)) throw std::runtime_error(::fp8mp::str(__VA_ARGS__));           \
  } while (0)

#define FP8MP_CHECK_VALUE(COND, ...)                                                             \
  do {                                                                                           \
    if (!(COND)) throw std::runtime_error(::fp8mp::str(::fp8mp::kValueErrorTag, __VA_ARGS__));   \
  } while (0)

// "[2, 4]", as torch prints a shape.
inline std::string shape_str(torch::headeronly::IntHeaderOnlyArrayRef sizes) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << "]";
  return out.str();
}

inline std::string shape_str(const Tensor& t) { return shape_str(t.sizes()); }

inline std::vector<int64_t> sizes_of(const Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); }

inline const char* dtype_str(ScalarType dtype) { return torch::headeronly::toString(dtype); }

// "cpu", "cuda:0", "meta", as torch prints a device.
inline std::string device_str(const Device& device) {
  std::string name;
  switch (device.type()) {
    case torch::headeronly::DeviceType::CPU: name = "cpu"; break;
    case torch::headeronly::DeviceType::CUDA: name = "cuda"; break;
    case torch::headeronly::DeviceType::Meta: name = "meta"; break;
    default: name = "device type " + std::to_string(int(device.type())); break;
  }
  return device.has_index() ? name + ":" + std::to_string(device.index()) : name;
}

inline std::string device_str(const Tensor& t) { return device_str(t.device()); }

inline bool same_device(const Tensor& a, const Tensor& b) { return a.device() == b.device(); }

inline HpType hp_type(ScalarType dtype) {
  switch (dtype) {
    case kFloat: return HpType::Float32;
    case kBFloat16: return HpType::BFloat16;
    case kHalf: return HpType::Float16;
    default: throw std::runtime_error(str("fp8mp: no kernel for dtype ", dtype_str(dtype)));
  }
}

// A new contiguous tensor of `sizes` and `dtype` on `like`'s device.
inline Tensor empty_on(const std::vector<int64_t>& sizes, ScalarType dtype, const Tensor& like) {
  return torch::stable::empty(sizes, dtype, std::nullopt, like.device());
}

inline Tensor as_contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

// The float32 column sums of a 2-D x, on x's device: torch's aten::sum over dim 0 with dtype float32, through
// the stable wrapper (which boxes `int[1]? dim` as the optional the shim reads). Its order of additions is
// torch's. The CUDA dbias (cast_to_fp8_transpose_dbias) is this; the CPU suite runs it on CPU tensors.
inline Tensor column_sum_fp32(const Tensor& x) {
  const int64_t dims[] = {0};
  return torch::stable::sum(x, torch::headeronly::IntHeaderOnlyArrayRef(dims, 1), /*keepdim=*/false, kFloat);
}

inline void stable_parallel_for(int64_t begin, int64_t end, int64_t grain, const RangeBody& body) {
  torch::stable::parallel_for(begin, end, grain, body);
}

// The one float of a 1-element CPU tensor (a scale), whatever its strides.
inline float cpu_scalar(const Tensor& t) { return *static_cast<const float*>(t.const_data_ptr()); }

}  // namespace fp8mp
