#include "hmc/resources/host_resources.hpp"

#include <cstring>

#include "hmc/error.hpp"

namespace hmc::resources {

std::function<void()> RankResources::createRuntime() {
  live_ = std::make_shared<Runtime>(*this);
  ++accounting_.runtimesCreated;
  std::shared_ptr<Runtime> runtime = live_;
  return [runtime] { runtime->release(); };
}

void Runtime::release() {
  if (owner_->faults_.releaseErrors > 0) {
    --owner_->faults_.releaseErrors;
    throw RuntimeError("injected runtime release failure");
  }
  released_ = true;
  ++owner_->accounting_.runtimesReleased;
  owner_->live_.reset();
}

HostWorkspace::HostWorkspace(std::string kind, std::int64_t nbytes, std::string dtype,
                             std::shared_ptr<RankResources> owner)
    : kind_(std::move(kind)), nbytes_(nbytes), dtype_(std::move(dtype)), owner_(std::move(owner)) {
  if (nbytes_ < 0) throw ValueError("workspace_bytes must be >= 0");
  buffer_.reset(new std::uint8_t[static_cast<std::size_t>(nbytes_)]);
  // Touch the pages so that a fresh bind pays for the memory it gets, as a device
  // allocation's first use would.
  std::memset(buffer_.get(), 0, static_cast<std::size_t>(nbytes_));
  owner_->accounting().bytesAllocated += nbytes_;
  ++owner_->accounting().workspacesCreated;
}

HostWorkspace::~HostWorkspace() { free(); }

nlohmann::json HostWorkspace::lifecycleSignature() const {
  return nlohmann::json::array({kind_, nbytes_, "torch." + dtype_});
}

bool HostWorkspace::canClose() const { return idle(); }

void HostWorkspace::close() {
  if (owner_->faults().closeErrors > 0) {
    --owner_->faults().closeErrors;
    throw RuntimeError("injected workspace close failure");
  }
  free();
  closed_ = true;
}

void HostWorkspace::free() noexcept {
  if (!buffer_) return;
  buffer_.reset();
  owner_->accounting().bytesFreed += nbytes_;
  ++owner_->accounting().workspacesClosed;
}

}  // namespace hmc::resources
