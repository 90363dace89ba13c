#pragma once
// `hmc-run compare BASELINE CURRENT`: the regression gate of a CI job. Reads two hmc-run
// reports (hmc-report/1 or hmc-report-set/1 with a "samples" section) or two Google Benchmark
// JSON files, matches metrics by scenario + metric (or benchmark name), runs a two-sided
// Mann-Whitney U test per metric (hmc/compare/statistics.hpp) and prints a table, JSON
// (--json or --format json), or a Markdown table for a CI job summary (--format markdown);
// --html FILE also writes a page drawing baseline against candidate per metric.
//
// Exit codes: 0 no metric slower beyond --max-regression with p < --alpha; 1 at least one
// (a regression); 2 bad input (unreadable file, unknown format, different kinds, nothing in
// common, or a selected metric with too few samples to decide).

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

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
};

// Registers the `compare` subcommand on `app`; the options land in `options`.
CLI::App* addCompareCommand(CLI::App& app, CompareOptions& options);

// Runs the comparison; returns the exit code. Prints results to stdout, errors to stderr.
int runCompare(const CompareOptions& options);
