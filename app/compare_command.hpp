#pragma once
// `hmc-run compare BASELINE CURRENT`: the regression gate of a CI job. Reads two hmc-run
// reports (hmc-report/1 or hmc-report-set/1 with a "samples" section) or two Google Benchmark
// JSON files, matches metrics by scenario + metric (or benchmark name), runs a two-sided
// Mann-Whitney U test per metric (hmc/compare/statistics.hpp) and prints a table, or JSON
// with --json.
//
// Exit codes: 0 no metric slower beyond --max-regression with p < --alpha; 1 at least one
// (a regression); 2 bad input (unreadable file, unknown format, different kinds, nothing in
// common, or a selected metric with too few samples to decide).

#include <CLI/CLI.hpp>
#include <string>

struct CompareOptions {
  std::string baselinePath;
  std::string currentPath;
  bool json = false;
  std::string maxRegression = "10%";  // percent; the '%' is optional
  double alpha = 0.05;
  std::string metricGlob;  // empty: every metric
};

// Registers the `compare` subcommand on `app`; the options land in `options`.
CLI::App* addCompareCommand(CLI::App& app, CompareOptions& options);

// Runs the comparison; returns the exit code. Prints results to stdout, errors to stderr.
int runCompare(const CompareOptions& options);
