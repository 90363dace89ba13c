#pragma once
// Sets an environment variable for one scope, and unsets it after (tests that read HMC_*
// variables through collective::processEnvironment()).

#include <stdlib.h>

namespace hmc::testing {

class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedVariable() { ::unsetenv(name_); }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
};

}  // namespace hmc::testing
