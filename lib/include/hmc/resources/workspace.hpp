#pragma once
// What every workspace of the built-in module types offers beside the lifecycle contract:
// the pending-backward counter, the `busy` fault and its size. Host and CUDA workspaces
// implement it; the scenario runner and the leak check see only this.

#include <cstdint>

#include "hmc/lifecycle/resource.hpp"

namespace hmc::resources {

class Workspace : public lifecycle::Resource {
 public:
  // Backward passes that still hold this workspace (it cannot close while any is pending).
  virtual void addPending() noexcept = 0;
  virtual void removePending() noexcept = 0;
  virtual int pending() const noexcept = 0;
  // The `busy` fault: a workspace that reports it cannot close.
  virtual void setBusy(bool busy) noexcept = 0;
  virtual std::int64_t nbytes() const noexcept = 0;
};

}  // namespace hmc::resources
