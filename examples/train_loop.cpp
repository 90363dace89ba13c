// A training-like LibTorch program built on hmc, the way a user writes one: it joins its world
// with one call (hmc::joinWorld), builds MulticoreModules, runs forward and backward, drops
// them and builds new ones each step (so that the first forward of a new module recycles the
// workspace the dropped one left: the 'recycle' collective), closes its last module, and ends
// the world (the collective close of what is left, the leak check, rank 0's report).
//
//   tests/support/torchrun --standalone --nproc_per_node 2 --no_python
//       build/examples/hmc-train-loop --steps 20          (one command line)
//   mpirun -np 4 build/examples/hmc-train-loop
//
// --skip-close RANK makes that rank skip its module's close and do local work for --linger
// seconds instead (the bug hmc exists for): the other ranks wait in 'close validation' until
// the deadline (HMC_TIMEOUT, seconds), and rank 0's report names the rank that did not come,
// where it was and on which host. --hand-assembled runs the same steps on a world put
// together by hand (transport and manager, no diagnostics), for the cost comparison
// (docs/embedding.md); it prints the mean step time either way. --crash RANK ends that rank
// in the middle of its steps (exit 17), as a segfault would. --reorder-close RANK ends with two
// models that RANK closes in the other order: every rank's close raises "multicore resource
// manifests differ across ranks", the program catches it, and the world's end says FAILED
// with the rank whose manifest differs (exit 1).

#include <torch/types.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/transport_factory.hpp"
#include "hmc/error.hpp"
#include "hmc/lifecycle/resource_manager.hpp"
#include "hmc/torch/scratch_modules.hpp"
#include "hmc/world/rank_placement.hpp"
#include "hmc/world/world.hpp"

namespace {

struct Options {
  int steps = 20;
  std::int64_t features = 64;
  int skipClose = -1;
  double lingerS = 6;
  bool handAssembled = false;
  int crash = -1;
  int reorderClose = -1;
};

[[noreturn]] void usage(const char* program, const std::string& problem) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s [--steps N] [--features F] [--skip-close RANK] [--linger S] "
               "[--crash RANK] [--reorder-close RANK] [--hand-assembled]\n",
               program, problem.c_str(), program);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], arg + " needs a value");
      return argv[++i];
    };
    try {
      if (arg == "--steps") {
        options.steps = std::stoi(value());
      } else if (arg == "--features") {
        options.features = std::stoll(value());
      } else if (arg == "--skip-close") {
        options.skipClose = std::stoi(value());
      } else if (arg == "--linger") {
        options.lingerS = std::stod(value());
      } else if (arg == "--crash") {
        options.crash = std::stoi(value());
      } else if (arg == "--reorder-close") {
        options.reorderClose = std::stoi(value());
      } else if (arg == "--hand-assembled") {
        options.handAssembled = true;
      } else {
        usage(argv[0], "unknown option " + arg);
      }
    } catch (const std::logic_error&) {
      usage(argv[0], "not a number after " + arg);
    }
  }
  if (options.steps < 1 || options.features < 1)
    usage(argv[0], "--steps and --features must be >= 1");
  return options;
}

// One training step: a fresh encoder and head (the previous step's were dropped, so their
// idle group is recycled by the first forward), forward, backward.
void trainStep(std::int64_t features) {
  hmc::nn::ScratchOptions options;
  options.features = features;
  auto encoder = std::make_shared<hmc::nn::ScratchLinear>(options);
  auto head = std::make_shared<hmc::nn::ScratchMLP>(options);
  const auto x = torch::randn({8, features}, torch::requires_grad());
  const auto loss = head->forward(encoder->forward(x)).sum();
  loss.backward();
}  // encoder and head are dropped here: their memberships retire locally

// The steps and the last module's close; the mean step time in seconds.
double run(const Options& options, int rank) {
  for (int warm = 0; warm < 2; ++warm) trainStep(options.features);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < options.steps; ++step) {
    if (rank == options.crash && step == options.steps / 2) {
      std::fprintf(stderr, "# example: rank %d crashes at step %d\n", rank, step);
      std::_Exit(17);  // a segfault's effect on the others: gone without a word
    }
    trainStep(options.features);
  }
  const double stepS =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      options.steps;
  hmc::nn::ScratchOptions last;
  last.features = options.features;
  auto model = std::make_shared<hmc::nn::ScratchLinear>(last);
  model->forward(torch::randn({8, options.features}, torch::requires_grad())).sum().backward();
  if (options.reorderClose >= 0) {
    // Two models closed one by one: the rank given closes them in the other order, so every
    // rank's first close finds the manifests differ (the program goes on past the error).
    auto second = std::make_shared<hmc::nn::ScratchLinear>(last);
    second->forward(torch::randn({8, options.features}, torch::requires_grad())).sum().backward();
    std::vector<std::shared_ptr<hmc::nn::ScratchLinear>> order{model, second};
    if (rank == options.reorderClose) std::swap(order[0], order[1]);
    std::fprintf(stderr, "# example: rank %d closing its two models%s\n", rank,
                 rank == options.reorderClose ? " in the other order" : "");
    for (const auto& each : order) {
      try {
        each->close();
      } catch (const hmc::Error& error) {
        std::fprintf(stderr, "# example: rank %d: %s: %s\n", rank,
                     std::string(error.className()).c_str(), error.what());
      }
    }
    return stepS;
  }
  if (rank == options.skipClose) {
    std::fprintf(stderr, "# example: rank %d skips its close and works alone for %g s\n", rank,
                 options.lingerS);
    std::this_thread::sleep_for(std::chrono::duration<double>(options.lingerS));
  } else {
    std::fprintf(stderr, "# example: rank %d closing its model\n", rank);
    model->close();
  }
  return stepS;
}

// The baseline: the same steps on a world assembled by hand, as README's "Using libhmc"
// shows: the transport and a manager, no watchdog, heartbeats, flight recorder or report.
int runHandAssembled(const Options& options) {
  const auto launch = hmc::collective::detectLaunch(hmc::collective::processEnvironment());
  if (!launch) {
    std::fprintf(stderr, "--hand-assembled: start it under torchrun, mpirun or srun\n");
    return 2;
  }
  hmc::world::RankLaunch rank;
  rank.placement = hmc::world::RankPlacement::fromLaunch(*launch);
  auto transport = hmc::collective::makeTransport(hmc::collective::Transport::kTcp,
                                                  rank.transportOptions(std::chrono::seconds(30)));
  auto manager = std::make_shared<hmc::lifecycle::ResourceManager>(transport.collective);
  hmc::lifecycle::ResourceManager::Scope scope(manager);
  const double stepS = run(options, launch->rank);
  manager->closeGroups();
  std::fprintf(stderr, "# example: rank %d hand-assembled step %.1f us\n", launch->rank,
               stepS * 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  if (options.handAssembled) return runHandAssembled(options);
  std::optional<hmc::World> joined;
  try {
    joined.emplace(hmc::joinWorld());
  } catch (const hmc::Error& error) {
    // The world did not form (a rank absent or killed): rank 0 reported which.
    std::fprintf(stderr, "# example: the world did not form: %s\n", error.what());
    return 3;
  }
  hmc::World& world = *joined;
  try {
    const double stepS = run(options, world.rank());
    std::fprintf(stderr, "# example: rank %d world step %.1f us\n", world.rank(), stepS * 1e6);
  } catch (const hmc::Error& error) {
    // A collective that hung or failed: the world's end says which rank, where, on which host.
    std::fprintf(stderr, "# example: rank %d: %s: %s\n", world.rank(),
                 std::string(error.className()).c_str(), error.what());
  }
  return world.close().exitCode;
}
