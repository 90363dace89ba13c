// The chaos campaign's driver (scripts/chaos, docs/chaos.md): a program on hmc::joinWorld that
// executes a campaign plan (an hmc-scenario/1 file) through the library API itself, the way a
// user's program would: hmc::nn scratch modules made on the world's manager, their forward and
// backward, shareExecutionResources, close(), the manager's closeGroups(); each step's error
// caught and the rank going on (a user's try/catch), a stall a sleep, a crash an _exit. The
// plan is read with the library's scenario parser; the scenario runner is not used, so that
// the campaign compares two executions of one plan: hmc-run's and this program's.
//
//   mpirun -np 3 hmc-plan-driver PLAN.json      (HMC_REPORT, HMC_TIMEOUT, HMC_RECORD as usual)
//
// It prints `# driver: rank R step I: <class>: <message>` for each step that failed, and ends
// with world.close(), whose exit code it returns (0 clean, 1 failed, 3 hung).

#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hmc/error.hpp"
#include "hmc/record/recording.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/torch/dtype.hpp"
#include "hmc/torch/scratch_modules.hpp"
#include "hmc/world/world.hpp"

namespace {

using hmc::scenario::FaultKind;
using hmc::scenario::Op;
using hmc::scenario::Step;

// A step the driver does not execute (the campaign never writes it): an error of the plan.
[[noreturn]] void unsupported(const Step& step) {
  throw hmc::ValueError("plan_driver: " + step.path + ": op '" +
                        std::string(hmc::scenario::toString(step.op)) +
                        "' is not one the driver executes; the campaign writes create, share, "
                        "forward, backward, drop, close, close_all, fault stall/crash, sleep "
                        "and repeat");
}

class Program {
 public:
  Program(const hmc::scenario::Scenario& plan, hmc::World& world)
      : plan_(plan), world_(world), rank_(world.rank()) {}

  // Runs the top-level steps; a step that throws is reported and the rank goes on, as a
  // program that catches its errors would.
  void run() {
    for (std::size_t i = 0; i < plan_.steps.size(); ++i) {
      const Step& step = plan_.steps[i];
      if (!runsHere(step)) continue;
      try {
        for (int r = 0; r < step.repeat; ++r) runOnce(step);
      } catch (const hmc::Error& error) {
        std::fprintf(stderr, "# driver: rank %d step %zu: %s: %s\n", rank_, i,
                     std::string(error.className()).c_str(), error.what());
      } catch (const std::exception& error) {
        std::fprintf(stderr, "# driver: rank %d step %zu: %s\n", rank_, i, error.what());
      }
    }
    pending_.clear();
    modules_.clear();  // dropped before the world's end, as at a program's scope end
  }

 private:
  bool runsHere(const Step& step) const {
    return !step.ranks ||
           std::find(step.ranks->begin(), step.ranks->end(), rank_) != step.ranks->end();
  }

  std::shared_ptr<hmc::nn::ScratchModule>& live(const std::string& name) {
    auto it = modules_.find(name);
    if (it == modules_.end()) {
      throw hmc::RuntimeError("plan_driver: module '" + name + "' is not live on rank " +
                              std::to_string(rank_));
    }
    return it->second;
  }

  hmc::record::Recorder* recorder() const { return world_.manager()->recorder(); }

  void runOnce(const Step& step) {
    switch (step.op) {
      case Op::kCreate: {
        if (modules_.count(step.module) != 0) {
          throw hmc::ValueError("plan_driver: module '" + step.module + "' is already live");
        }
        hmc::nn::ScratchOptions options;
        options.features = step.features;
        options.workspaceBytes = step.workspaceBytes;
        if (step.compat && !step.compat->is_null()) options.compat = step.compat;
        options.scope = step.scope;
        options.name = step.module;  // the recording's name, so that a replay matches the plan
        auto module = hmc::nn::makeScratchModule(step.type, std::move(options));
        if (!module) unsupported(step);
        modules_[step.module] = std::move(module);
        break;
      }
      case Op::kShare: {
        std::vector<hmc::nn::MulticoreModule*> members;
        for (const auto& name : step.modules) members.push_back(live(name).get());
        hmc::nn::MulticoreModule::shareExecutionResources(members);
        break;
      }
      case Op::kForward:
        forward(step);
        break;
      case Op::kBackward: {
        auto it = pending_.find(step.module);
        if (it == pending_.end()) break;
        const std::int32_t index = live(step.module)->recordIndex();
        std::vector<torch::Tensor> outputs = std::move(it->second);
        pending_.erase(it);
        hmc::record::recordCall(recorder(), hmc::record::EventOp::kBackward, index, [&] {
          for (auto& y : outputs) y.sum().backward();
        });
        break;
      }
      case Op::kDrop:
        live(step.module);
        pending_.erase(step.module);
        modules_.erase(step.module);
        break;
      case Op::kClose:
        live(step.module)->close();
        break;
      case Op::kCloseAll:
        world_.manager()->closeGroups();
        break;
      case Op::kFault:
        fault(step);
        break;
      case Op::kSleep:
        std::this_thread::sleep_for(std::chrono::duration<double>(step.seconds));
        break;
      case Op::kRepeat:
        for (int i = 0; i < step.count; ++i) {
          for (const Step& inner : step.steps) {
            if (!runsHere(inner)) continue;
            for (int r = 0; r < inner.repeat; ++r) runOnce(inner);
          }
        }
        break;
      default:
        unsupported(step);
    }
  }

  void forward(const Step& step) {
    auto& module = live(step.module);
    const std::string dtypeName = step.dtype.value_or(plan_.dtype);
    const auto dtype = hmc::nn::dtypeFromName(dtypeName);
    if (!dtype) throw hmc::ValueError("plan_driver: unknown dtype '" + dtypeName + "'");
    auto x = torch::randn({step.batch, module->features()}, torch::TensorOptions().dtype(*dtype))
                 .requires_grad_(true);
    torch::Tensor y = module->forward(x);
    if (step.backward) {
      y.sum().backward();
      return;
    }
    pending_[step.module].push_back(std::move(y));
    // The backward left pending is the program's own autograd, which the recording cannot see:
    // say so, as hmc-run does, so that the replay keeps it pending too.
    if (hmc::record::Recorder* recording = recorder()) {
      recording->append(hmc::record::EventOp::kPending, module->recordIndex(),
                        hmc::record::Outcome::kOk, std::chrono::nanoseconds(0));
    }
  }

  void fault(const Step& step) {
    if (step.faultKind == FaultKind::kCrash) {
      std::fprintf(stderr, "# driver: rank %d crashes (plan step %s)\n", rank_, step.path.c_str());
      std::fflush(stderr);
      if (hmc::record::Recorder* recording = recorder()) {
        recording->append(hmc::record::EventOp::kFault, -1, hmc::record::Outcome::kOk,
                          std::chrono::nanoseconds(0), {{"fault", "crash"}});
      }
      ::_exit(17);  // gone without a word, as a segfault would be
    }
    if (step.faultKind != FaultKind::kStall) unsupported(step);
    hmc::record::recordCall(
        recorder(), hmc::record::EventOp::kFault, -1,
        [&] { std::this_thread::sleep_for(std::chrono::duration<double>(step.seconds)); },
        {{"fault", "stall"}, {"seconds", step.seconds}});
  }

  const hmc::scenario::Scenario& plan_;
  hmc::World& world_;
  int rank_;
  std::map<std::string, std::shared_ptr<hmc::nn::ScratchModule>> modules_;
  std::map<std::string, std::vector<torch::Tensor>> pending_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PLAN.json (an hmc-scenario/1 file written by scripts/chaos)\n",
                 argv[0]);
    return 2;
  }
  hmc::scenario::Scenario plan;
  try {
    plan = hmc::scenario::loadScenario(argv[1]);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", argv[0], error.what());
    return 2;
  }
  hmc::JoinOptions options;
  options.name = plan.name;
  // The campaign's mark that hmc's code runs in this process (checks.one_verdict): a job torn
  // down before any rank got here (LibTorch loads for about a second) can have no verdict.
  std::fprintf(stderr, "# driver: joining the world\n");
  hmc::World world = hmc::joinWorld(options);
  Program(plan, world).run();
  return world.close().exitCode;
}
