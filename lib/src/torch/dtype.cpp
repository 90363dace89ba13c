#include "hmc/torch/dtype.hpp"

#include <array>
#include <utility>

namespace hmc::nn {
namespace {
constexpr std::array<std::pair<c10::ScalarType, std::string_view>, 11> kNames{{
    {c10::ScalarType::Float, "float32"},
    {c10::ScalarType::Double, "float64"},
    {c10::ScalarType::Half, "float16"},
    {c10::ScalarType::BFloat16, "bfloat16"},
    {c10::ScalarType::Byte, "uint8"},
    {c10::ScalarType::Char, "int8"},
    {c10::ScalarType::Short, "int16"},
    {c10::ScalarType::Int, "int32"},
    {c10::ScalarType::Long, "int64"},
    {c10::ScalarType::Bool, "bool"},
    {c10::ScalarType::ComplexFloat, "complex64"},
}};
}  // namespace

std::string dtypeName(c10::ScalarType type) {
  for (const auto& [scalar, name] : kNames) {
    if (scalar == type) return std::string(name);
  }
  return c10::toString(type);
}

std::optional<c10::ScalarType> dtypeFromName(std::string_view name) {
  for (const auto& [scalar, text] : kNames) {
    if (text == name) return scalar;
  }
  return std::nullopt;
}

}  // namespace hmc::nn
