#pragma once
// One status line redrawn in place on stderr when stderr is a terminal (a user watching a long
// run), nothing otherwise: pipes and CI logs get no carriage returns. Not thread-safe: its
// owner serializes the calls.

#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace hmc::app {

class TerminalLine {
 public:
  explicit TerminalLine(bool enabled) : enabled_(enabled) {}
  bool enabled() const noexcept { return enabled_; }
  void show(const std::string& text) {
    if (!enabled_) return;
    fmt::print(stderr, "\r\033[K{}", text);
    std::fflush(stderr);
  }
  void clear() {
    if (!enabled_) return;
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
};

}  // namespace hmc::app
