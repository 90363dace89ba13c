#include "hmc/collective/transport.hpp"

namespace hmc::collective {

bool ranksAreProcesses(Transport transport) noexcept {
  return transport == Transport::kTcp || transport == Transport::kStore ||
         transport == Transport::kGloo || transport == Transport::kNccl;
}

}  // namespace hmc::collective
