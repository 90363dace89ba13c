#pragma once
// `hmc-run compare BASELINE CURRENT`: the regression gate of a CI job. Reads two hmc-run
// reports (hmc-report/1 or hmc-report-set/1 with a "samples" section) or two Google Benchmark
// JSON files, matches metrics by scenario + metric (or benchmark name), runs a two-sided
// Mann-Whitney U test per metric (hmc/compare/statistics.hpp) and prints a table, JSON
// (--json or --format json), or a Markdown table for a CI job summary (--format markdown);
// --html FILE also writes a page drawing baseline against candidate per metric.
// `hmc-run compare --ab OLD_HMC_RUN NEW_HMC_RUN SCENARIO` runs the scenario with both programs
// in alternating rounds (old, new; new, old; ...) and compares the rounds paired, so that a
// machine that drifts between runs moves both sides of a round alike and cancels.
// The gated metrics (--gate; by default the labelled cycles `repeat/<label>` of reports) are
// read together with Holm's step-down adjustment (--correction); the others are information.
//
// Exit codes: 0 no metric slower beyond --max-regression with p < --alpha; 1 at least one
// (a regression); 2 bad input (unreadable file, unknown format, different kinds, nothing in
// common, or a selected metric with too few samples to decide).

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

struct CompareOptions {
  std::string baselinePath;
  std::string currentPath;
  bool json = false;             // --json: the same as --format json
  std::string format = "table";  // --format: table, json or markdown
  std::optional<std::string> htmlPath;
  std::string maxRegression = "10%";  // percent; the '%' is optional
  double alpha = 0.05;
  std::string metricGlob;  // empty: every metric
  bool strict = false;     // --strict: an inconclusive metric fails the gate too
  std::string correction = "holm";  // --correction: holm or none
  std::string gateGlob;             // --gate: empty, the labelled cycles (or every metric)
  // --ab OLD NEW: run the scenario (the one positional argument) with both hmc-run programs in
  // alternating rounds and compare the rounds paired.
  std::vector<std::string> ab;
  std::size_t rounds = 10;           // --rounds
  std::size_t roundRepetitions = 6;  // --round-repetitions (hmc-run's --repetitions per run)
};

// Registers the `compare` subcommand on `app`; the options land in `options`.
CLI::App* addCompareCommand(CLI::App& app, CompareOptions& options);

// Runs the comparison; returns the exit code. Prints results to stdout, errors to stderr.
int runCompare(const CompareOptions& options);
