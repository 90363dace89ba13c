#pragma once
// Torch dtypes spelled the way Python spells them ("float32", not "Float").

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <string_view>

namespace hmc::nn {

// "float32", "float64", "float16", "bfloat16", "int64", ...
std::string dtypeName(c10::ScalarType type);
// The inverse for the scenario dtypes; nullopt for an unknown name.
std::optional<c10::ScalarType> dtypeFromName(std::string_view name);

}  // namespace hmc::nn
