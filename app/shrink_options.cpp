// `hmc-run shrink`'s command line: declared in the torch-free front too (--help, parsing), run
// by the runner (shrink_command.cpp).
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "hmc/enum_names.hpp"
#include "hmc/scenario/failure_signature.hpp"
#include "shrink_command.hpp"

namespace hmc::app {

CLI::App* addShrinkCommand(CLI::App& app, ShrinkOptions& options) {
  auto* shrink = app.add_subcommand(
      "shrink",
      "Make a failing scenario as small as possible while it still fails the same way (same "
      "kind, op, stage, rank pattern and masked error text), and write it. Exit 0 written, 1 the "
      "result did not reproduce at the scenario's own deadline, 2 bad input or a scenario that "
      "does not fail, 130 interrupted (the best so far written)");
  shrink->add_option("scenario", options.input, "The failing scenario file")->required();
  shrink->add_option("-o,--output", options.output,
                     "Where to write the smallest scenario found (not the input file)");
  shrink
      ->add_option(
          "--same", options.same,
          "How much of the failure must stay the same: outcome (the kind only: hang, collective "
          "mismatch, manifest mismatch, error, unmet, crash, leak), stage (and the op and "
          "collective stage), text (and the masked error text), all (and which statuses the "
          "ranks show)")
      ->check(CLI::IsMember(enumNames<scenario::SameLevel>()))
      ->capture_default_str();
  shrink
      ->add_option_function<double>(
          "--trial-timeout",
          [&options](const double& seconds) {
            options.trialTimeout = std::chrono::duration<double>(seconds);
          },
                   "The collective deadline of each trial in seconds (a trial that hangs costs "
                   "it); the result is confirmed once with the scenario's own timeout_s")
      ->check(CLI::Range(0.01, 3600.0))
      ->default_str(fmt::format("{:g}", options.trialTimeout.count()));
  shrink
      ->add_option_function<std::string>(
          "--transport",
          [&options](const std::string& name) {
            options.transport = *collective::transportFromString(name);
          },
          "Where trials run: threads (the default, fast), or tcp, store, gloo: local rank "
          "processes, for a failure that needs them (a rank process that crashes)")
      ->check(CLI::IsMember({"threads", "tcp", "store", "gloo"}));
  shrink
      ->add_option_function<double>(
          "--max-seconds",
          [&options](const double& seconds) {
            options.budget = std::chrono::duration<double>(seconds);
          },
                   "Stop shrinking after this many seconds and write the best so far")
      ->check(CLI::Range(1.0, 86400.0))
      ->default_str(fmt::format("{:g}", options.budget.count()));
  shrink->add_flag("--as-test", options.asTest,
                   "Set every step's expect to what it did, so that the file passes while the "
                   "failure stays and fails once it changes (a CI regression test)");
  shrink->add_flag("--signature", options.signatureOnly,
                   "Only run the scenario once and print its failure signature (no -o needed)");
  shrink
      ->add_option(
          "--log-level", options.logLevel,
          "Library log level on stderr during trials: trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  shrink->footer(
      "Examples:\n"
      "  hmc-run shrink big-failing.json -o minimal.json\n"
      "  hmc-run shrink big-failing.json -o regression.json --as-test --max-seconds 120\n"
      "  hmc-run shrink big-failing.json --signature\n"
      "See docs/shrink.md.");
  return shrink;
}

}  // namespace hmc::app
