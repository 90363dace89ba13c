#pragma once
// The main of the suites that need a CUDA device. Where none is usable the suite does not
// run: it prints "SKIPPED: <reason>" and exits with kCudaSkipReturnCode, which CTest shows as
// "***Skipped" (never as passed; `ctest -L cuda -V` prints the reason). With
// HMC_REQUIRE_CUDA=1 in the environment (scripts/device-check) a missing device is a
// failure instead.
//
// A file that uses it defines DOCTEST_CONFIG_IMPLEMENT before including doctest and ends with
//   int main(int argc, char** argv) { return hmc::testing::runCudaSuite(argc, argv, reason); }

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace hmc::testing {

inline constexpr int kCudaSkipReturnCode = 77;

// `skipReason` empty: run the suite.
inline int runCudaSuite(int argc, char** argv, const std::string& skipReason) {
  if (!skipReason.empty()) {
    const char* require = std::getenv("HMC_REQUIRE_CUDA");
    if (require != nullptr && *require != '\0' && std::string(require) != "0") {
      std::printf("FAILED: HMC_REQUIRE_CUDA is set but %s\n", skipReason.c_str());
      return 1;
    }
    std::printf("SKIPPED: %s\n", skipReason.c_str());
    return kCudaSkipReturnCode;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

}  // namespace hmc::testing
