#pragma once
// The transports by name, and the one factory of a rank process's transport. The threads
// transport builds a whole world of ranks in one process (threads_transport.hpp); the others
// build one rank of a world of processes: `makeTransport` (in hmc::transports, which links
// LibTorch's c10d; transport_factory.hpp).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hmc::collective {

enum class Transport {
  kAuto,     // threads without a launcher, tcp under one (resolved by the caller)
  kThreads,  // every rank a thread of one process
  kTcp,      // direct TCP connections between rank processes; the c10d store to rendezvous
  kStore,    // exchanges through the c10d TCPStore
  kGloo,     // c10d ProcessGroupGloo allgathers
  kNccl,     // NCCL allgathers between GPUs; the store is the bootstrap
};

std::string_view toString(Transport transport) noexcept;
// nullopt for an unknown name.
std::optional<Transport> transportFromString(std::string_view name) noexcept;
// Every name, in the order above ("auto", "threads", "tcp", "store", "gloo", "nccl").
std::vector<std::string> transportNames();
// Whether the ranks of `transport` are processes (tcp, store, gloo, nccl).
bool ranksAreProcesses(Transport transport) noexcept;

}  // namespace hmc::collective
