#include "hmc/collective/transport_factory.hpp"

#include <fmt/format.h>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/tcp_transport.hpp"
#include "hmc/config.hpp"
#include "hmc/error.hpp"
#if HMC_HAVE_GLOO
#include "hmc/collective/gloo_transport.hpp"
#endif
#if HMC_HAVE_CUDA
#include "hmc/collective/nccl_transport.hpp"
#endif

namespace hmc::collective {
namespace {

// The gloo transport's own store: its port and the prefix GlooTransport is given (it keeps
// its keys under "<prefix>/gloo").
int glooPortOf(const TransportOptions& options) {
  return options.glooPort != 0 ? options.glooPort : options.masterPort + 1;
}
std::string glooPrefixOf(const TransportOptions& options) { return options.prefix + "-gloo"; }

// The address gloo binds and announces: this rank's own (HMC_ADVERTISE_ADDR, else the
// interface that routes to the master), as the tcp transport's; never the master's, which
// no other host can bind.
std::string glooDeviceHost(const TransportOptions& options) {
  if (options.masterAddr == "localhost") return "127.0.0.1";
  return advertiseAddress(options.masterAddr, options.masterPort);
}

}  // namespace

std::vector<WorldStore> worldStores(Transport transport, const TransportOptions& options) {
  std::vector<WorldStore> stores{{options.masterPort, options.prefix}};
  if (transport == Transport::kGloo && options.glooControlStore) {
    stores.push_back({glooPortOf(options), glooPrefixOf(options) + "/gloo"});
  }
  return stores;
}

ProcessTransport makeTransport(Transport transport, const TransportOptions& options) {
  if (!ranksAreProcesses(transport)) {
    throw ValueError(fmt::format(
        "makeTransport: '{}' is not a transport of rank processes (tcp, store, gloo or nccl)",
        toString(transport)));
  }
  StoreTransportOptions store;
  store.host = options.masterAddr;
  store.port = options.masterPort;
  store.rank = options.rank;
  store.worldSize = options.worldSize;
  store.timeout = options.timeout;
  store.joinTimeout = options.joinTimeout;
  store.prefix = options.prefix;
  if (!options.rankZeroHostsStore) store.isServer = false;

  ProcessTransport out;
#if HMC_HAVE_GLOO
  if (transport == Transport::kGloo && !options.glooControlStore) {
    GlooTransportOptions gloo;
    gloo.store = store;
    gloo.deviceHost = glooDeviceHost(options);
    gloo.threads = options.glooThreads;
    out.collective = std::make_shared<GlooTransport>(gloo);
    return out;
  }
#endif
  out.control = std::make_shared<StoreTransport>(store);
  out.collective = out.control;
  switch (transport) {
    case Transport::kTcp: {
      // Direct connections between the ranks; the control store is only the rendezvous and
      // stays the out-of-band channel.
      TcpTransportOptions tcp;
      tcp.control = out.control;
      out.collective = std::make_shared<TcpTransport>(tcp);
      break;
    }
    case Transport::kGloo: {
#if HMC_HAVE_GLOO
      GlooTransportOptions gloo;
      gloo.store = store;
      gloo.store.port = glooPortOf(options);
      gloo.store.prefix = glooPrefixOf(options);
      gloo.deviceHost = glooDeviceHost(options);
      gloo.threads = options.glooThreads;
      out.collective = std::make_shared<GlooTransport>(gloo);
#else
      throw BackendError(
          "--transport gloo: this build has no Gloo (HMC_WITH_GLOO=OFF or ProcessGroupGloo.hpp "
          "missing); use --transport tcp or store");
#endif
      break;
    }
    case Transport::kNccl: {
#if HMC_HAVE_CUDA
      // NCCL all-gathers between GPUs (rank r on device r % deviceCount); the store stays the
      // bootstrap (the unique id) and the out-of-band channel, and names the ranks that did
      // not arrive when an exchange times out.
      NcclTransportOptions nccl;
      nccl.bootstrap = out.control;
      nccl.timeout = options.timeout;
      nccl.joinTimeout = options.joinTimeout;
      nccl.arrivals = out.control->keyValueStore();
      out.collective = std::make_shared<NcclTransport>(nccl);
#else
      throw BackendError(
          "--transport nccl: this build has no CUDA (HMC_WITH_CUDA=OFF, or the CUDA toolkit or "
          "NCCL was not found); use --transport tcp, store or gloo");
#endif
      break;
    }
    default:
      break;  // kStore: the control store is the collective
  }
  return out;
}

}  // namespace hmc::collective
