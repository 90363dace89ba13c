#pragma once
// The transports by name, and the one factory of a rank process's transport. The threads
// transport builds a whole world of ranks in one process (threads_transport.hpp); the others
// build one rank of a world of processes: `makeTransport` (in hmc::transports, which links
// LibTorch's c10d; transport_factory.hpp).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/enum_names.hpp"

namespace hmc::collective {

enum class Transport {
  kAuto,     // threads without a launcher, tcp under one (resolved by the caller)
  kThreads,  // every rank a thread of one process
  kTcp,      // direct TCP connections between rank processes; the c10d store to rendezvous
  kStore,    // exchanges through the c10d TCPStore
  kGloo,     // c10d ProcessGroupGloo allgathers
  kNccl,     // NCCL allgathers between GPUs; the store is the bootstrap
};

// The `--transport` values.
inline constexpr EnumName<Transport> kTransportNames[] = {
    {Transport::kAuto, "auto"},   {Transport::kThreads, "threads"}, {Transport::kTcp, "tcp"},
    {Transport::kStore, "store"}, {Transport::kGloo, "gloo"},       {Transport::kNccl, "nccl"},
};
constexpr EnumTable<Transport> enumTable(Transport) { return {"transport", kTransportNames}; }

inline std::string_view toString(Transport transport) noexcept { return enumName(transport); }
// nullopt for an unknown name.
inline std::optional<Transport> transportFromString(std::string_view name) noexcept {
  return enumFromName<Transport>(name);
}
// Every name, in the order above ("auto", "threads", "tcp", "store", "gloo", "nccl").
inline std::vector<std::string> transportNames() { return enumNames<Transport>(); }
// Whether the ranks of `transport` are processes (tcp, store, gloo, nccl).
bool ranksAreProcesses(Transport transport) noexcept;

}  // namespace hmc::collective
