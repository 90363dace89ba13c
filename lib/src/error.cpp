#include "hmc/error.hpp"

#include "hmc/text.hpp"

namespace hmc {

namespace {
std::string scenarioMessage(const std::string& file, const std::string& path,
                            const std::string& what) {
  // The file name and the JSON path (which holds the keys of the file) are user text.
  std::string out = file.empty() ? std::string("<scenario>") : printable(file);
  out += ": ";
  out += path.empty() ? std::string("/") : printable(path);
  out += ": ";
  out += what;
  return out;
}
}  // namespace

ScenarioError::ScenarioError(std::string file, std::string jsonPath, const std::string& what)
    : Error(ErrorKind::kScenario, scenarioMessage(file, jsonPath, what)),
      file_(std::move(file)),
      jsonPath_(std::move(jsonPath)),
      detail_(what) {}

ErrorKind kindOf(const std::exception& error) noexcept {
  if (const auto* hmcError = dynamic_cast<const Error*>(&error)) return hmcError->kind();
  return ErrorKind::kRuntimeError;
}

std::string_view classNameOf(const std::exception& error) noexcept {
  if (const auto* hmcError = dynamic_cast<const Error*>(&error)) return hmcError->className();
  return "RuntimeError";
}

}  // namespace hmc
