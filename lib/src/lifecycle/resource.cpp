#include "hmc/lifecycle/resource.hpp"

#include <fmt/format.h>

namespace hmc::lifecycle {

std::string Binding::repr() const {
  std::string deviceRepr;
  const auto colon = device.find(':');
  if (colon == std::string::npos) {
    deviceRepr = fmt::format("device(type='{}')", device);
  } else {
    deviceRepr = fmt::format("device(type='{}', index={})", device.substr(0, colon),
                             device.substr(colon + 1));
  }
  return fmt::format("({}, torch.{})", deviceRepr, dtype);
}

}  // namespace hmc::lifecycle
