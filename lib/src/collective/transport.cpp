#include "hmc/collective/transport.hpp"

namespace hmc::collective {
namespace {

constexpr Transport kAll[] = {Transport::kAuto,  Transport::kThreads, Transport::kTcp,
                              Transport::kStore, Transport::kGloo,    Transport::kNccl};

}  // namespace

std::string_view toString(Transport transport) noexcept {
  switch (transport) {
    case Transport::kAuto:
      return "auto";
    case Transport::kThreads:
      return "threads";
    case Transport::kTcp:
      return "tcp";
    case Transport::kStore:
      return "store";
    case Transport::kGloo:
      return "gloo";
    case Transport::kNccl:
      return "nccl";
  }
  return "auto";
}

std::optional<Transport> transportFromString(std::string_view name) noexcept {
  for (Transport transport : kAll) {
    if (toString(transport) == name) return transport;
  }
  return std::nullopt;
}

std::vector<std::string> transportNames() {
  std::vector<std::string> names;
  for (Transport transport : kAll) names.emplace_back(toString(transport));
  return names;
}

bool ranksAreProcesses(Transport transport) noexcept {
  return transport == Transport::kTcp || transport == Transport::kStore ||
         transport == Transport::kGloo || transport == Transport::kNccl;
}

}  // namespace hmc::collective
