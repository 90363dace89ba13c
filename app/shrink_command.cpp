#include "shrink_command.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "exit_codes.hpp"
#include "hmc/error.hpp"
#include "hmc/scenario/failure_signature.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/scenario/shrinker.hpp"
#include "hmc/scenario/thread_driver.hpp"
#include "hmc/text.hpp"
#include "hmc/world/signals.hpp"
#include "hmc/world/world_driver.hpp"
#include "run_plan.hpp"
#include "terminal_line.hpp"

namespace hmc::app {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr int kExitFailed = 1;
constexpr int kExitInterrupted = 130;

std::string grouped(std::size_t n) {
  std::string digits = std::to_string(n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) {
    digits.insert(static_cast<std::size_t>(i), ",");
  }
  return digits;
}

std::string sizeText(const json& scenario) {
  const auto size = scenario::scenarioSize(scenario);
  return fmt::format("{} step{} x {} rank{}", grouped(size.steps), size.steps == 1 ? "" : "s",
                     size.ranks, size.ranks == 1 ? "" : "s");
}

// A step with `op` first, then what it acts on, its fields, and the fields every step may carry
// last (nested steps likewise).
nlohmann::ordered_json orderedStep(const json& step) {
  if (!step.is_object()) return step;
  static const std::vector<std::string> kFirst = {"op", "module", "modules", "kind"};
  static const std::vector<std::string> kLast = {"ranks", "repeat", "expect", "expect_error",
                                                 "label", "count",  "steps"};
  nlohmann::ordered_json out;
  for (const auto& key : kFirst) {
    if (step.contains(key)) out[key] = step[key];
  }
  for (const auto& [key, value] : step.items()) {
    if (std::find(kFirst.begin(), kFirst.end(), key) == kFirst.end() &&
        std::find(kLast.begin(), kLast.end(), key) == kLast.end()) {
      out[key] = value;
    }
  }
  for (const auto& key : kLast) {
    if (!step.contains(key)) continue;
    if (key == "steps" && step[key].is_array()) {
      nlohmann::ordered_json nested = nlohmann::ordered_json::array();
      for (const auto& s : step[key]) nested.push_back(orderedStep(s));
      out[key] = std::move(nested);
    } else {
      out[key] = step[key];
    }
  }
  return out;
}

// A scenario file as the examples are written: keys in the format's order, one per line, one
// step a line.
std::string formatOrdered(const json& scenario) {
  static const char* kOrder[] = {"format", "name",      "description",       "world_size", "device",
                                 "dtype",  "timeout_s", "reference_differs", "steps"};
  std::vector<std::string> keys(std::begin(kOrder), std::end(kOrder));
  for (const auto& [key, value] : scenario.items()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  std::string text = "{\n";
  bool first = true;
  for (const auto& key : keys) {
    if (!scenario.contains(key)) continue;
    if (!first) text += ",\n";
    first = false;
    const json& value = scenario[key];
    if (key == "steps" && value.is_array()) {
      text += "  \"steps\": [\n";
      for (std::size_t i = 0; i < value.size(); ++i) {
        text += "    " + orderedStep(value[i]).dump() + (i + 1 < value.size() ? ",\n" : "\n");
      }
      text += "  ]";
    } else {
      text += fmt::format("  {}: {}", json(key).dump(), value.dump());
    }
  }
  return text + "\n}\n";
}

struct Trial {
  scenario::ScenarioReport report;
  bool interrupted = false;
};

// Runs scenario documents on one world: every run a fresh world of the candidate's size.
class TrialRunner {
 public:
  TrialRunner(const ShrinkOptions& options, const RankProgram& program)
      : options_(options), program_(program) {
    run_.transport = options.transport;
    run_.logLevel = options.logLevel;
  }

  // 0, or the exit code of a usage error it printed.
  int plan() {
    if (const int code = planRun(run_, &plan_); code != 0) return code;
    if (plan_.launch) {
      usageError(fmt::format(
          "shrink: started by {} as one rank of a job; shrink starts its own ranks for every "
          "trial: run it as a plain command (hmc-run shrink IN.json -o OUT.json)",
          plan_.launch->launcher));
      return kExitUsage;
    }
    return 0;
  }

  std::string transport() const { return std::string(collective::toString(plan_.transport)); }

  // Runs `document` with collective deadlines of `timeoutS`. Throws ScenarioError when it does
  // not parse.
  Trial run(const json& document, double timeoutS) {
    json candidate = document;
    candidate["timeout_s"] = timeoutS;
    const std::string text = candidate.dump();
    const scenario::Scenario parsed = scenario::parseScenarioText(text, options_.input);
    scenario::ReportBuilder builder(parsed, 0);
    bool any = false;
    // Every trial through the run's driver: thread ranks share this runner's interrupt (one
    // signal forwarder for the whole shrink), rank processes are started and stopped by it.
    world::WorldOptions world = worldOptions(plan_, run_, program_, parsed);
    world.interrupt = &interrupt_;
    const auto driver = world::makeWorldDriver(std::move(world));
    const world::WorldRun ran = driver->run(
        {parsed, options_.input, text}, [&builder, &any](std::vector<scenario::RankResult> ranks) {
          builder.add(std::move(ranks));
          any = true;
        });
    const bool interrupted = ran.interrupted || interrupt_.interrupted();
    Trial trial;
    trial.interrupted = interrupted || !any || world::pendingSignal() != 0;
    if (!any) return trial;
    scenario::RunInfo info;
    info.transport = transport();
    trial.report = std::move(builder).build(info);
    return trial;
  }

  // Ctrl-C, SIGTERM or SIGHUP stop the thread ranks of the trial in progress.
  void watchSignals() {
    forwarder_.emplace([this](int, const std::string& why) { interrupt_.interrupt(why); });
  }
  TrialRunner(const TrialRunner&) = delete;
  TrialRunner& operator=(const TrialRunner&) = delete;

 private:
  const ShrinkOptions& options_;
  const RankProgram& program_;
  RunOptions run_;
  RunPlan plan_;
  scenario::ThreadInterrupt interrupt_;
  std::optional<world::SignalForwarder> forwarder_;  // after interrupt_: stops first
};

// "# shrink: trial 57, trying 1,203 steps x 16 ranks, best 310 steps x 16 ranks, 12 s" on a
// terminal; nothing in a pipe.
class ShrinkProgress {
 public:
  explicit ShrinkProgress(bool enabled) : line_(enabled) {}
  void show(std::size_t trial, const json& trying, const json& best, double seconds) {
    if (!line_.enabled()) return;
    line_.show(fmt::format("# shrink: trial {}, trying {}, best {}, {:.0f} s", trial,
                           sizeText(trying), sizeText(best), seconds));
  }
  void clear() { line_.clear(); }

 private:
  TerminalLine line_;
};

void say(const std::string& line) {
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

// 0, or the exit code of the usage error it printed: -o is given, is not the input, and is a
// file hmc-run may write.
int checkOutput(const ShrinkOptions& options) {
  namespace fs = std::filesystem;
  if (!options.signatureOnly && options.output.empty()) {
    usageError(
        "shrink: no output file: pass -o OUT.json (or --signature to print the failure "
        "signature only)");
    return kExitUsage;
  }
  std::error_code ec;
  if (!options.output.empty() && fs::equivalent(options.input, options.output, ec)) {
    usageError(
        fmt::format("shrink: the output {} is the input file; write the shrunk scenario "
                    "to another file, e.g. -o minimal.json",
                    printable(options.output)));
    return kExitUsage;
  }
  if (!options.output.empty()) {
    if (const std::string why = scenario::checkOutputPath(options.output); !why.empty()) {
      usageError("shrink: " + why);
      return kExitUsage;
    }
  }
  return 0;
}

// The scenario to shrink, as its JSON document (what the shrinker edits) and its own deadline.
struct ShrinkInput {
  json document;
  double ownTimeout = 0;
};

// nullopt after the usage error it printed: the file does not read or does not parse.
std::optional<ShrinkInput> readInput(const ShrinkOptions& options) {
  try {
    const std::string text = scenario::readScenarioFile(options.input);
    const scenario::Scenario original = scenario::parseScenarioText(text, options.input);
    return ShrinkInput{json::parse(text), original.timeoutS};
  } catch (const ScenarioError& error) {
    usageError(fmt::format("shrink: {}; fix the file (hmc-run validate {}) and run shrink again",
                           error.what(), printable(options.input)));
    return std::nullopt;
  }
}

// One shrink, from the first run (the failure to keep) to the written file. The trials run on
// `runner`; the signals are the caller's.
class ShrinkSession {
 public:
  ShrinkSession(const ShrinkOptions& options, TrialRunner& runner, ShrinkInput input)
      : options_(options),
        runner_(runner),
        document_(std::move(input.document)),
        ownTimeout_(input.ownTimeout),
        same_(parseEnum<scenario::SameLevel>(options.same)),
        from_(sizeText(document_)) {}

  // The exit code: 0 written (or the signature printed), 1 not confirmed, 2 not failing or not
  // writable, 130 interrupted.
  int run() {
    start_ = Clock::now();
    if (const int code = keepFirstFailure(); code >= 0) return code;
    chooseTrialDeadline();
    say(fmt::format(
        "# shrinking {}: trials on {} with a {:g} s deadline, at most {:g} s "
        "(--max-seconds), matching at --same {}",
        from_, runner_.transport(), trialTimeout_, options_.budget.count(), options_.same));
    shrink();
    if (interrupted_) return interruptedAfter("while shrinking");
    return confirmAndWrite();
  }

 private:
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  // The failure to keep: a run with the scenario's own deadline. -1 to go on, else the exit code.
  int keepFirstFailure() {
    const Trial reference = runner_.run(document_, ownTimeout_);
    if (reference.interrupted) {
      fmt::print(stderr,
                 "hmc-run: shrink: interrupted by signal {} ({}) during the first run; "
                 "nothing written\n",
                 world::pendingSignal(), strsignal(world::pendingSignal()));
      return kExitInterrupted;
    }
    signature_ = scenario::failureSignature(reference.report);
    if (!signature_.fails()) {
      usageError(fmt::format(
          "shrink: {} does not fail: every step met its expectation on every rank and nothing "
          "leaked ({}, {} transport, outcome {}); shrink needs a scenario that fails. Run it "
          "with 'hmc-run {}' to see its results; a step whose expect already names the failure "
          "(e.g. expect \"hang\") does not count as failing",
          printable(options_.input), from_, runner_.transport(),
          scenario::toString(reference.report.outcome), printable(options_.input)));
      return kExitUsage;
    }
    say(fmt::format("# failure: {}", signature_.describe()));
    if (options_.signatureOnly) {
      say(fmt::format("# signature: {}", signature_.toJson().dump()));
      return 0;
    }
    return -1;
  }

  // Trials with a short deadline, unless the failure needs the scenario's own.
  void chooseTrialDeadline() {
    trialTimeout_ = std::min(options_.trialTimeout.count(), ownTimeout_);
    if (trialTimeout_ >= ownTimeout_) return;
    const Trial quick = runner_.run(document_, trialTimeout_);
    if (quick.interrupted || scenario::failureSignature(quick.report).sameAs(signature_, same_)) {
      return;
    }
    say(fmt::format(
        "# with a {:g} s deadline it fails differently ({}); trials use the "
        "scenario's own {:g} s",
        trialTimeout_, scenario::failureSignature(quick.report).describe(), ownTimeout_));
    trialTimeout_ = ownTimeout_;
  }

  // Runs the shrinker until it is done, interrupted or out of --max-seconds.
  void shrink() {
    ShrinkProgress progress(isatty(STDERR_FILENO) != 0);
    const json* best = &document_;
    scenario::Shrinker shrinker(
        document_,
        [&](const json& candidate) {
          ++trials_;
          progress.show(trials_, candidate, *best, elapsed());
          const Trial trial = runner_.run(candidate, trialTimeout_);
          if (trial.interrupted) {
            interrupted_ = true;
            return false;
          }
          return scenario::failureSignature(trial.report).sameAs(signature_, same_);
        },
        [&] {
          if (world::pendingSignal() != 0) interrupted_ = true;
          if (elapsed() > options_.budget.count()) outOfTime_ = true;
          return interrupted_ || outOfTime_;
        });
    best = &shrinker.best();
    shrinker.run();
    progress.clear();
    result_ = shrinker.best();
    shrinkSeconds_ = elapsed();
  }

  bool write(const json& scenario) {
    try {
      scenario::writeOutputFile(options_.output, formatOrdered(scenario));
      return true;
    } catch (const Error& error) {
      usageError(fmt::format("shrink: {}", error.what()));
      return false;
    }
  }

  int interruptedAfter(const char* when) {
    if (!write(result_)) return kExitUsage;
    fmt::print(stderr,
               "hmc-run: shrink: interrupted by signal {} ({}) {} after {} trials ({:.0f} s): "
               "wrote the best so far, {} (from {}), to {}; it failed the same way with the {:g} s "
               "trial deadline and was not confirmed with the scenario's own\n",
               world::pendingSignal(), strsignal(world::pendingSignal()), when, trials_,
               shrinkSeconds_, sizeText(result_), from_, printable(options_.output), trialTimeout_);
    return kExitInterrupted;
  }

  // Confirms the result once with the scenario's own deadline, then writes it.
  int confirmAndWrite() {
    namespace fs = std::filesystem;
    const Trial confirm = runner_.run(result_, ownTimeout_);
    const scenario::FailureSignature got = scenario::failureSignature(confirm.report);
    if (confirm.interrupted) return interruptedAfter("while confirming");
    if (!got.sameAs(signature_, same_)) {
      fmt::print(stderr,
                 "hmc-run: shrink: the shrunk scenario ({}) did not fail the same way with the "
                 "scenario's own {:g} s deadline (it gave: {}); nothing written. Trials ran with "
                 "a {:g} s deadline: rerun with a larger one, e.g. --trial-timeout {:g}\n",
                 sizeText(result_), ownTimeout_, got.describe(), trialTimeout_,
                 std::min(ownTimeout_, trialTimeout_ * 4));
      return kExitFailed;
    }
    const std::string description =
        fmt::format("Shrunk by hmc-run shrink from {} ({}); fails: {}",
                    fs::path(options_.input).filename().string(), from_, got.describe());
    if (options_.asTest) {
      if (const int code = makeTest(confirm, description); code != 0) return code;
    } else {
      result_["description"] = description;
    }
    if (!write(result_)) return kExitUsage;
    if (outOfTime_) {
      say(
          fmt::format("# stopped at --max-seconds {:g}: wrote the best so far; a longer run may "
                      "shrink it further",
                      options_.budget.count()));
    }
    if (confirm.report.hang && !confirm.report.hang->diagnosis.empty()) {
      say(fmt::format("# hang: {}", confirm.report.hang->diagnosis));
    }
    say(fmt::format("shrunk {} to {} in {} trials ({:.0f} s); same failure: {}; wrote {}", from_,
                    sizeText(result_), grouped(trials_), elapsed(), got.summary(),
                    printable(options_.output)));
    return 0;
  }

  // --as-test: every step expects what it did; the file must pass when run again. 0, or the
  // exit code.
  int makeTest(const Trial& confirm, const std::string& description) {
    result_ = scenario::asTest(result_, confirm.report.ranks);
    result_["description"] = description + ". Every step expects what it did (--as-test)";
    const Trial green = runner_.run(result_, ownTimeout_);
    if (green.interrupted || green.report.outcome != scenario::Outcome::kPass) {
      fmt::print(stderr,
                 "hmc-run: shrink: the --as-test file of the shrunk scenario did not pass when "
                 "run again (outcome {}): the failure is not deterministic enough for a test; "
                 "nothing written. Run without --as-test to keep the failing file\n",
                 green.interrupted ? "interrupted" : scenario::toString(green.report.outcome));
      return kExitFailed;
    }
    if (signature_.kind == scenario::FailureKind::kLeak) {
      say("# note: a leak is not an expectation of hmc-scenario/1: the --as-test file passes "
          "whether or not it leaks; check the report's leaks section in CI");
    }
    return 0;
  }

  const ShrinkOptions& options_;
  TrialRunner& runner_;
  const json document_;
  const double ownTimeout_;
  const scenario::SameLevel same_;
  const std::string from_;  // the input's size, "1,003 steps x 16 ranks"
  Clock::time_point start_;
  scenario::FailureSignature signature_;
  double trialTimeout_ = 0;
  std::size_t trials_ = 0;
  bool interrupted_ = false;
  bool outOfTime_ = false;
  json result_;
  double shrinkSeconds_ = 0;
};

}  // namespace

int runShrink(const ShrinkOptions& options, const RankProgram& program) {
  if (const int code = checkOutput(options); code != 0) return code;
  std::optional<ShrinkInput> input = readInput(options);
  if (!input) return kExitUsage;
  TrialRunner runner(options, program);
  if (const int code = runner.plan(); code != 0) return code;
  scenario::limitTorchThreads(1);
  world::SignalScope signals;
  world::unblockTerminationSignals();
  runner.watchSignals();
  return ShrinkSession(options, runner, std::move(*input)).run();
}

}  // namespace hmc::app
