#include "hmc/enum_names.hpp"

#include "hmc/error.hpp"
#include "hmc/text.hpp"

namespace hmc::detail {

void throwUnknownEnumName(std::string_view what, std::string_view name,
                          const std::vector<std::string_view>& names) {
  std::string message = "unknown ";
  message += what;
  message += " '";
  message += printable(name);  // user text: a CLI value, a field of a file
  message += "' (expected one of: ";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) message += ", ";
    message += names[i];
  }
  message += ")";
  throw ValueError(message);
}

}  // namespace hmc::detail
