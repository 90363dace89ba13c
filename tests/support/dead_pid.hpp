#pragma once
// A pid that is certainly not a live process, for tests of code that asks whether a rank's
// process is alive: a child that exited and was reaped (its pid is free until reused).

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace hmc::testing {

inline pid_t deadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

}  // namespace hmc::testing
