#include "format.hpp"

#include <fmt/format.h>

#include <cmath>

namespace hmc::render::detail {

using nlohmann::json;

const json* child(const json& value, std::string_view key) {
  if (!value.is_object()) return nullptr;
  const auto it = value.find(key);
  if (it == value.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string textOf(const json& value, std::string_view key, std::string fallback) {
  const json* member = child(value, key);
  if (member == nullptr) return fallback;
  if (member->is_string()) return member->get<std::string>();
  return member->dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<double> numberOf(const json& value, std::string_view key) {
  const json* member = child(value, key);
  if (member == nullptr || !member->is_number()) return std::nullopt;
  const double number = member->get<double>();
  if (!std::isfinite(number)) return std::nullopt;
  return number;
}

namespace {
void collectNumbers(const json& value, std::vector<double>& out) {
  if (value.is_number()) {
    const double number = value.get<double>();
    if (std::isfinite(number)) out.push_back(number);
  } else if (value.is_array()) {
    for (const auto& item : value) collectNumbers(item, out);
  }
}
}  // namespace

std::vector<double> numbersOf(const json* value) {
  std::vector<double> out;
  if (value != nullptr && value->is_array()) collectNumbers(*value, out);
  return out;
}

std::string formatSeconds(double seconds) {
  const double magnitude = std::fabs(seconds);
  if (magnitude == 0) return "0 s";
  if (magnitude < 1e-6) return fmt::format("{:.1f} ns", seconds * 1e9);
  if (magnitude < 1e-3) return fmt::format("{:.1f} us", seconds * 1e6);
  if (magnitude < 1) return fmt::format("{:.2f} ms", seconds * 1e3);
  return fmt::format("{:.3f} s", seconds);
}

std::string formatValue(double value, std::string_view unit) {
  if (unit == "s" || unit.empty()) return formatSeconds(value);
  if (unit == "bytes") {
    const double magnitude = std::fabs(value);
    if (magnitude >= 1024.0 * 1024 * 1024)
      return fmt::format("{:.3g} GiB", value / (1024.0 * 1024 * 1024));
    if (magnitude >= 1024.0 * 1024) return fmt::format("{:.3g} MiB", value / (1024.0 * 1024));
    if (magnitude >= 1024.0) return fmt::format("{:.3g} KiB", value / 1024.0);
    return fmt::format("{:g} B", value);
  }
  if (unit == "count") return fmt::format("{:.4g}", value);
  return fmt::format("{:.4g} {}", value, unit);
}

std::string formatChange(std::optional<double> change) {
  return change ? fmt::format("{:+.1f}%", *change * 100) : "n/a";
}

std::string formatChangeInterval(const json& metric) {
  const json* interval = child(metric, "change_interval");
  if (interval == nullptr || !interval->is_array() || interval->size() != 2 ||
      !(*interval)[0].is_number() || !(*interval)[1].is_number()) {
    return "n/a";
  }
  return fmt::format("[{:+.1f}%, {:+.1f}%]", (*interval)[0].get<double>() * 100,
                     (*interval)[1].get<double>() * 100);
}

std::string formatP(std::optional<double> p) { return p ? fmt::format("{:.4f}", *p) : "n/a"; }

namespace {
std::string joinNames(const json* names) {
  std::string out;
  if (names == nullptr || !names->is_array()) return out;
  for (const auto& name : *names) {
    out += (out.empty() ? "" : ", ") + (name.is_string() ? name.get<std::string>() : name.dump());
  }
  return out;
}
}  // namespace

CompareVerdict compareVerdict(const json& document) {
  const double alpha = numberOf(document, "alpha").value_or(0.05);
  const double maxRegression = numberOf(document, "max_regression").value_or(0.10);
  const json* regressions = child(document, "regressions");
  const json* undecided = child(document, "undecided");
  const std::size_t slower =
      regressions != nullptr && regressions->is_array() ? regressions->size() : 0;
  const std::size_t open = undecided != nullptr && undecided->is_array() ? undecided->size() : 0;
  const json* metrics = child(document, "metrics");
  const std::size_t compared = metrics != nullptr && metrics->is_array() ? metrics->size() : 0;
  if (slower > 0) {
    return {"FAILED",
            fmt::format("{} slower by more than {:g}% with p < {:g}: {}",
                        slower == 1 ? std::string("1 metric") : fmt::format("{} metrics", slower),
                        maxRegression * 100, alpha, joinNames(regressions))};
  }
  const json* inconclusive = child(document, "inconclusive");
  const std::size_t unsure =
      inconclusive != nullptr && inconclusive->is_array() ? inconclusive->size() : 0;
  const std::string unsureLine =
      unsure == 0 ? std::string()
                  : fmt::format("{} not significant but not shown within +/-{:g}% either (more "
                                "samples would decide): {}",
                                unsure == 1 ? std::string("1 metric")
                                            : fmt::format("{} metrics", unsure),
                                maxRegression * 100, joinNames(inconclusive));
  const json* strict = child(document, "strict");
  if (unsure > 0 && strict != nullptr && strict->is_boolean() && strict->get<bool>()) {
    return {"FAILED", unsureLine + " (--strict)"};
  }
  if (open > 0) {
    return {"UNDECIDED",
            fmt::format("too few samples to decide {} (run hmc-run with more --repetitions)",
                        joinNames(undecided))};
  }
  if (unsure > 0) return {"INCONCLUSIVE", unsureLine};
  return {"OK", fmt::format("no metric slower by more than {:g}% with p < {:g} ({} compared)",
                            maxRegression * 100, alpha, compared)};
}

CompareMethod compareMethod(const nlohmann::json& document) {
  CompareMethod out;
  const bool paired = textOf(document, "design", "unpaired") == "paired";
  out.test = paired ? "paired Wilcoxon signed-rank" : "two-sided Mann-Whitney U";
  const nlohmann::json* drift = child(document, "drift_control");
  if (drift != nullptr && drift->is_object() && textOf(*drift, "method") == "ab") {
    out.drift = fmt::format(
        "A/B: {} rounds alternating the two builds on {}, each round's pair one log ratio, so "
        "machine drift between rounds cancels",
        numberOf(*drift, "rounds").value_or(0), textOf(*drift, "scenario", "?"));
  } else {
    out.drift = "none: two files written apart, their samples unpaired";
  }
  const std::string gate = textOf(document, "gate", "*");
  const auto gated = numberOf(document, "gated_metrics");
  const std::string which = gate == "*" ? std::string("every metric") : gate;
  const std::string count =
      gated ? fmt::format(" ({} gated)", static_cast<long long>(*gated)) : std::string();
  if (textOf(document, "correction", "none") == "holm") {
    out.gate = fmt::format(
        "{}{}, p-values adjusted by Holm's step-down over them; the other metrics are "
        "information",
        which, count);
  } else {
    out.gate = fmt::format("{}{}, each at alpha without correction", which, count);
  }
  return out;
}

}  // namespace hmc::render::detail
