#pragma once
// The process-wide registry of hmc's own device handles: memory, streams, events and NCCL
// communicators that hmc created and has not yet released. Leak accounting reads it at the
// end of a run to attribute what is left to an owner (rank, module, binding), next to
// cudaMemGetInfo's before/after figures, which also see memory that is not hmc's.
// No CUDA includes: a CPU build holds an empty registry.
//
// Thread safety: every member function may be called from any thread.

#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/enum_names.hpp"

namespace hmc::resources {

enum class DeviceHandleKind { kMemory, kStream, kEvent, kCommunicator };

inline constexpr EnumName<DeviceHandleKind> kDeviceHandleKindNames[] = {
    {DeviceHandleKind::kMemory, "memory"},
    {DeviceHandleKind::kStream, "stream"},
    {DeviceHandleKind::kEvent, "event"},
    {DeviceHandleKind::kCommunicator, "communicator"},
};
constexpr EnumTable<DeviceHandleKind> enumTable(DeviceHandleKind) {
  return {"device handle kind", kDeviceHandleKindNames};
}
inline std::string_view toString(DeviceHandleKind kind) noexcept { return enumName(kind); }

struct DeviceHandleRecord {
  DeviceHandleKind kind = DeviceHandleKind::kMemory;
  int device = 0;
  std::int64_t bytes = 0;  // memory only
  std::string owner;       // who holds it: "rank 0 scratch_linear cuda:0"
  std::uint64_t id = 0;    // the handle's id (DeviceRegistry::HandleId); not in toJson
};

// What was live at one moment.
struct DeviceRegistrySnapshot {
  std::int64_t liveBytes = 0;
  std::int64_t allocations = 0;
  std::int64_t streams = 0;
  std::int64_t events = 0;
  std::int64_t communicators = 0;
  std::vector<DeviceHandleRecord> live;  // in registration order

  bool empty() const noexcept { return live.empty(); }
  // {"live_bytes", "allocations", "streams", "events", "communicators", "live": [{"kind",
  // "device", "bytes", "owner"}]}
  nlohmann::json toJson() const;
};

class DeviceRegistry {
 public:
  using HandleId = std::uint64_t;

  static DeviceRegistry& instance();

  DeviceRegistry() = default;
  DeviceRegistry(const DeviceRegistry&) = delete;
  DeviceRegistry& operator=(const DeviceRegistry&) = delete;

  // Records a handle that hmc just created; the id unregisters it.
  HandleId add(DeviceHandleKind kind, int device, std::int64_t bytes, std::string owner);
  // Forgets a released handle. Unknown ids (0, twice) are ignored.
  void remove(HandleId id) noexcept;
  DeviceRegistrySnapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<HandleId, DeviceHandleRecord> live_;
  HandleId next_ = 1;
};

}  // namespace hmc::resources
