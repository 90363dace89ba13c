#include "hmc/world/rank_progress.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "hmc/host.hpp"
#include "hmc/scenario/runner.hpp"

namespace hmc::world {

RankProgress::Snapshot RankProgress::snapshot(const scenario::Scenario& scenario, int rank,
                                              int signal) const {
  std::lock_guard<std::mutex> lock(mutex_);
  Snapshot snap{completed_ - done_.size(), done_};
  std::vector<scenario::RankResult>& results = snap.results;
  if (!recorder_) return snap;
  scenario::RankResult partial;
  partial.rank = rank;
  partial.host = hostName();
  partial.pid = processId();
  partial.steps = steps_;
  partial.flight = recorder_->entries();
  partial.leaks.reason = "the rank was stopped by a signal: not checked";
  const int step = recorder_->step();
  const auto last = recorder_->last();
  const std::string by = fmt::format("stopped by signal {} ({})", signal, strsignal(signal));
  if (last && last->status == "in_flight" && step >= 0 &&
      step < static_cast<int>(scenario.steps.size())) {
    const scenario::Step& definition = scenario.steps[step];
    scenario::StepResult waiting;
    waiting.index = step;
    waiting.op = definition.op;
    if (!definition.module.empty()) waiting.module = definition.module;
    waiting.label = definition.label;
    waiting.status = scenario::StepStatus::kHang;
    waiting.startS = last->startS;
    waiting.error = scenario::StepError{
        ErrorKind::kRankFailure,
        fmt::format("{} while waiting in '{}' #{}: the launcher or the user ended the run "
                    "(did another rank exit?)",
                    by, last->stage, last->sequence)};
    waiting.error->stage = last->stage;
    waiting.error->sequence = last->sequence;
    waiting.error->collectivesBefore = last->sequence;
    waiting.expected = scenario::expectationMet(definition, waiting);
    partial.steps.push_back(std::move(waiting));
    partial.hung = true;
  } else {
    // A rank that hung earlier is reported as hung (where it waited is in its steps and
    // flight record); any other rank was stopped in the middle of its work.
    partial.hung = std::any_of(partial.steps.begin(), partial.steps.end(), [](const auto& s) {
      return s.status == scenario::StepStatus::kHang;
    });
    if (!partial.hung) {
      partial.stopped = true;  // alive until the signal: not crashed
      partial.crashReason =
          step < 0 ? by + " after its steps" : fmt::format("{} in step {}", by, step);
    }
  }
  results.push_back(std::move(partial));
  return snap;
}

}  // namespace hmc::world
