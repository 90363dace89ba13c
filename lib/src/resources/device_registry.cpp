#include "hmc/resources/device_registry.hpp"

namespace hmc::resources {

nlohmann::json DeviceRegistrySnapshot::toJson() const {
  nlohmann::json handles = nlohmann::json::array();
  for (const DeviceHandleRecord& record : live) {
    handles.push_back({{"kind", toString(record.kind)},
                       {"device", record.device},
                       {"bytes", record.bytes},
                       {"owner", record.owner}});
  }
  return {
      {"live_bytes", liveBytes}, {"allocations", allocations},     {"streams", streams},
      {"events", events},        {"communicators", communicators}, {"live", std::move(handles)}};
}

DeviceRegistry& DeviceRegistry::instance() {
  static DeviceRegistry registry;
  return registry;
}

DeviceRegistry::HandleId DeviceRegistry::add(DeviceHandleKind kind, int device, std::int64_t bytes,
                                             std::string owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  const HandleId id = next_++;
  live_.emplace(id, DeviceHandleRecord{kind, device, bytes, std::move(owner), id});
  return id;
}

void DeviceRegistry::remove(HandleId id) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  live_.erase(id);
}

DeviceRegistrySnapshot DeviceRegistry::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceRegistrySnapshot result;
  result.live.reserve(live_.size());
  for (const auto& [id, record] : live_) {
    switch (record.kind) {
      case DeviceHandleKind::kMemory:
        result.liveBytes += record.bytes;
        ++result.allocations;
        break;
      case DeviceHandleKind::kStream:
        ++result.streams;
        break;
      case DeviceHandleKind::kEvent:
        ++result.events;
        break;
      case DeviceHandleKind::kCommunicator:
        ++result.communicators;
        break;
    }
    result.live.push_back(record);
    result.live.back().id = id;
  }
  return result;
}

}  // namespace hmc::resources
