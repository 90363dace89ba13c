#pragma once
// Shared by the HTML and Markdown renderers: reading documents leniently and writing numbers
// the way hmc-run's console does.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hmc::render::detail {

// The member `key` of an object, or nullptr when `value` is not an object, lacks it or holds
// null there.
const nlohmann::json* child(const nlohmann::json& value, std::string_view key);
// A string member (numbers and other values as their JSON text), else `fallback`.
std::string textOf(const nlohmann::json& value, std::string_view key, std::string fallback = "");
// A finite number member, else nullopt.
std::optional<double> numberOf(const nlohmann::json& value, std::string_view key);
// An array member's finite numbers (nested arrays flattened), else empty.
std::vector<double> numbersOf(const nlohmann::json* value);

// Seconds in a readable unit: "312.4 us" (the console's format).
std::string formatSeconds(double seconds);
// A value of `unit`: "s" as formatSeconds, "bytes" as "16 KiB", anything else "%g unit".
std::string formatValue(double value, std::string_view unit);
// "+12.3%" or "n/a".
std::string formatChange(std::optional<double> change);
// A metric's "change_interval" of hmc-compare/1: "[-3.1%, +12.0%]", or "n/a".
std::string formatChangeInterval(const nlohmann::json& metric);
// "0.0079" or "n/a".
std::string formatP(std::optional<double> p);

// The overall verdict of an `hmc-compare/1` document: "OK", "FAILED" or "UNDECIDED", and the
// sentence the console prints for it.
struct CompareVerdict {
  std::string word;
  std::string line;
};
CompareVerdict compareVerdict(const nlohmann::json& document);

// How an hmc-compare/1 document reached its verdicts, in words: the test ("two-sided
// Mann-Whitney U" or "paired Wilcoxon signed-rank"), the drift control (none, or the A/B
// rounds) and the gate (which metrics, how their p-values are corrected). Documents written
// before these fields read as unpaired, no drift control, every metric at alpha.
struct CompareMethod {
  std::string test;
  std::string drift;
  std::string gate;
};
CompareMethod compareMethod(const nlohmann::json& document);

}  // namespace hmc::render::detail
