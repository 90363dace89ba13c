#pragma once
// hmc's error hierarchy. Every error hmc raises derives from hmc::Error and carries a kind
// that maps onto the report's `error.kind` (scenario-format.md). The three classes of the
// reference implementation (RuntimeError, ValueError, TypeError) keep their Python names so
// that collective error texts read word for word like the reference's.

#include <stdexcept>
#include <string>
#include <string_view>

#include "hmc/enum_names.hpp"

namespace hmc {

enum class ErrorKind {
  kRuntimeError,
  kValueError,
  kTypeError,
  kTimeout,
  kCheckFailed,
  kCollectiveMismatch,
  kRankFailure,
  kScenario,
  kBackend,
};

// The report spelling (`error.kind`).
inline constexpr EnumName<ErrorKind> kErrorKindNames[] = {
    {ErrorKind::kRuntimeError, "runtime_error"},
    {ErrorKind::kValueError, "value_error"},
    {ErrorKind::kTypeError, "type_error"},
    {ErrorKind::kTimeout, "timeout"},
    {ErrorKind::kCheckFailed, "check_failed"},
    {ErrorKind::kCollectiveMismatch, "collective_mismatch"},
    {ErrorKind::kRankFailure, "rank_failure"},
    {ErrorKind::kScenario, "scenario_error"},
    {ErrorKind::kBackend, "backend_error"},
};
constexpr EnumTable<ErrorKind> enumTable(ErrorKind) { return {"error kind", kErrorKindNames}; }

inline std::string_view toString(ErrorKind kind) noexcept { return enumName(kind); }

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }
  // The class name the reference would print (`type(exc).__name__`).
  virtual std::string_view className() const noexcept = 0;

 private:
  ErrorKind kind_;
};

#define HMC_DECLARE_ERROR(Name, Kind)                                      \
  class Name : public Error {                                              \
   public:                                                                 \
    explicit Name(const std::string& message) : Error(Kind, message) {}    \
    std::string_view className() const noexcept override { return #Name; } \
  }

HMC_DECLARE_ERROR(RuntimeError, ErrorKind::kRuntimeError);
HMC_DECLARE_ERROR(ValueError, ErrorKind::kValueError);
HMC_DECLARE_ERROR(TypeError, ErrorKind::kTypeError);
// A collective passed its deadline.
HMC_DECLARE_ERROR(TimeoutError, ErrorKind::kTimeout);
// Ranks entered different collectives (different stage tags at the same sequence number).
HMC_DECLARE_ERROR(CollectiveMismatch, ErrorKind::kCollectiveMismatch);
// A peer rank died or left while others waited for it.
HMC_DECLARE_ERROR(RankFailure, ErrorKind::kRankFailure);
// A scenario `check` step found a different local state.
HMC_DECLARE_ERROR(CheckFailed, ErrorKind::kCheckFailed);
// A CUDA, NCCL or Torch call failed; the message names the call and the library's reason.
HMC_DECLARE_ERROR(BackendError, ErrorKind::kBackend);

#undef HMC_DECLARE_ERROR

// Bad scenario input: names the file and the JSON path (RFC 6901) of the offending value.
class ScenarioError : public Error {
 public:
  ScenarioError(std::string file, std::string jsonPath, const std::string& what);
  std::string_view className() const noexcept override { return "ScenarioError"; }
  const std::string& file() const noexcept { return file_; }
  const std::string& jsonPath() const noexcept { return jsonPath_; }
  // The message without the "file: path: " prefix.
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::string file_;
  std::string jsonPath_;
  std::string detail_;
};

// The report kind of any exception: hmc errors keep theirs, anything else is a runtime_error
// (as the reference sees a c10::Error: a Python RuntimeError).
ErrorKind kindOf(const std::exception& error) noexcept;
// `type(exc).__name__` as the reference would print it.
std::string_view classNameOf(const std::exception& error) noexcept;

}  // namespace hmc
