#pragma once
// What every workspace of the built-in module types offers beside the lifecycle contract:
// the pending-backward counter, the `busy` fault and its size. Host and CUDA workspaces
// implement it; the scenario runner and the leak check see only this.

#include <atomic>
#include <cstdint>

#include "hmc/lifecycle/resource.hpp"

namespace hmc::resources {

class Workspace : public lifecycle::Resource {
 public:
  // Backward passes that still hold this workspace (it cannot close while any is pending).
  // Backward may run on an autograd thread: the count is atomic.
  void addPending() noexcept { ++pending_; }
  void removePending() noexcept { --pending_; }
  int pending() const noexcept { return pending_.load(); }
  // The `busy` fault: a workspace that reports it cannot close.
  void setBusy(bool busy) noexcept { busy_ = busy; }
  virtual std::int64_t nbytes() const noexcept = 0;

 protected:
  // No pending backward and not busy: what every workspace's canClose() starts from.
  bool idle() const noexcept { return pending_.load() == 0 && !busy_; }

 private:
  std::atomic<int> pending_{0};
  bool busy_ = false;
};

}  // namespace hmc::resources
