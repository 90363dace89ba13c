#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "failure.hpp"
#include "hmc/error.hpp"
#include "hmc/render/html.hpp"
#include "hmc/text.hpp"
#include "page.hpp"

namespace hmc::render {

using nlohmann::json;
using namespace detail;

namespace {

// Every status a step can have, its colour (Okabe-Ito, safe for the common colour-vision
// deficiencies), the mark drawn in its cell (so colour is never the only cue) and its legend.
struct StatusStyle {
  const char* status;
  const char* fill;
  const char* ink;
  const char* mark;
  const char* legend;
};
constexpr StatusStyle kStatusStyles[] = {
    {"ok", "#009E73", "#ffffff", "", "ok"},
    {"error", "#D55E00", "#ffffff", "\u2715", "error"},
    {"hang", "#CC79A7", "#1b1f24", "\u2016", "hang (a collective past its deadline)"},
    {"skipped", "#56B4E9", "#1b1f24", "\u2013", "skipped (not this rank's step)"},
    {"not_run", "#E4E7EB", "#57606a", "", "not run (after a hang or crash)"},
};
const StatusStyle& styleOf(const std::string& status) {
  for (const auto& style : kStatusStyles) {
    if (status == style.status) return style;
  }
  static const StatusStyle unknown{"?", "#999999", "#ffffff", "?", "unknown"};
  return unknown;
}

// ---- the hang: who waits, who is missing ----------------------------------------------------

enum class Role { kNone, kWaiting, kMissing, kCrashed };

struct HangFacts {
  std::map<long long, std::string> byRank;  // the diagnosis's words about each rank
  std::map<long long, Role> roles;
  std::set<long long> hangSteps;  // top-level steps where a rank hung
  std::string stage;              // "'close validation' #1", when known
  FailureParts parts;             // each rank's part in the report's first failure
};

// The integers of "[1, 3]" starting at `from` (the text after "ranks ").
std::vector<long long> rankList(const std::string& text, std::size_t from) {
  std::vector<long long> ranks;
  if (from >= text.size() || text[from] != '[') return ranks;
  const std::size_t end = text.find(']', from);
  if (end == std::string::npos) return ranks;
  std::size_t i = from + 1;
  while (i < end) {
    while (i < end && (text[i] < '0' || text[i] > '9')) ++i;
    std::size_t j = i;
    while (j < end && text[j] >= '0' && text[j] <= '9') ++j;
    if (j > i) ranks.push_back(std::stoll(text.substr(i, j - i)));
    i = j;
  }
  return ranks;
}

HangFacts hangFacts(const json& report) {
  HangFacts facts;
  facts.parts = failurePartsOf(report);
  const json* hang = child(report, "hang");
  const std::string diagnosis = hang != nullptr ? textOf(*hang, "diagnosis") : "";
  // "rank 0 waits in 'close validation' #1 (step 2); rank 1 never arrived: ..."
  std::size_t at = 0;
  while (at < diagnosis.size()) {
    std::size_t next = diagnosis.find("; rank ", at);
    const std::string part =
        diagnosis.substr(at, next == std::string::npos ? std::string::npos : next - at);
    at = next == std::string::npos ? diagnosis.size() : next + 2;
    if (part.rfind("rank ", 0) != 0) continue;
    std::size_t digits = 5;
    while (digits < part.size() && part[digits] >= '0' && part[digits] <= '9') ++digits;
    if (digits == 5) continue;
    const long long rank = std::stoll(part.substr(5, digits - 5));
    const std::string words = part.substr(std::min(part.size(), digits + 1));
    facts.byRank[rank] = words;
    if (words.rfind("waits in ", 0) == 0) {
      facts.roles[rank] = Role::kWaiting;
      if (facts.stage.empty()) {
        const std::size_t stageEnd = words.find(" (step");
        facts.stage =
            words.substr(9, stageEnd == std::string::npos ? std::string::npos : stageEnd - 9);
        const std::size_t comma = facts.stage.find(',');
        if (comma != std::string::npos) facts.stage.resize(comma);
      }
    } else if (words.find("never arrived") != std::string::npos) {
      facts.roles[rank] = Role::kMissing;
    } else if (words.find("crashed") != std::string::npos) {
      facts.roles[rank] = Role::kCrashed;
    }
  }
  // The hung steps, and the ranks their timeouts name ("ranks [1] did not arrive").
  if (const json* ranks = arrayOf(report, "ranks")) {
    for (const auto& rank : *ranks) {
      const long long r = integerOf(rank, "rank").value_or(-1);
      if (flag(rank, "crashed") && facts.roles.count(r) == 0) facts.roles[r] = Role::kCrashed;
      const json* steps = arrayOf(rank, "steps");
      if (steps == nullptr) continue;
      for (const auto& step : *steps) {
        if (textOf(step, "status") != "hang") continue;
        facts.hangSteps.insert(integerOf(step, "index").value_or(-1));
        if (facts.roles.count(r) == 0) facts.roles[r] = Role::kWaiting;
        const std::string message = textOf(objectOf(child(step, "error")), "message");
        const std::size_t named = message.find("ranks [");
        if (named != std::string::npos &&
            message.find("did not arrive", named) != std::string::npos) {
          for (const long long missing : rankList(message, named + 6)) {
            if (facts.roles.count(missing) == 0 || facts.roles[missing] == Role::kNone) {
              facts.roles[missing] = Role::kMissing;
            }
          }
        }
      }
    }
  }
  return facts;
}

// ---- sections of a report ------------------------------------------------------------------

std::string outcomeOf(const json& report) { return textOf(report, "outcome", "unknown"); }

// Why the scenario could not run: the file, where in it, and what is wrong.
void invalidCallout(std::string& out, const json& report) {
  const json& error = objectOf(child(report, "error"));
  out +=
      "<div class=\"callout invalid\" id=\"invalid\"><strong class=\"head\">The scenario "
      "could not run</strong><code>" +
      esc(textOf(error, "file")) + "</code>";
  const std::string path = textOf(error, "path");
  if (!path.empty()) out += " at <code>" + esc(path) + "</code>";
  out += ": " + esc(textOf(error, "message")) + "</div>\n";
}

// The hang: where, which ranks wait, which never arrived, and the diagnosis word for word.
void hangCallout(std::string& out, const json& report, const json& hang, const HangFacts& facts) {
  std::vector<long long> waiting;
  std::vector<long long> missing;
  for (const auto& [rank, role] : facts.roles) {
    if (role == Role::kWaiting) waiting.push_back(rank);
    if (role == Role::kMissing) missing.push_back(rank);
  }
  bool unexpected = false;
  if (const json* ranks = arrayOf(report, "ranks")) {
    for (const auto& rank : *ranks) {
      for (const auto& step : objectOf(arrayOf(rank, "steps"))) {
        if (textOf(step, "status") == "hang" && !flag(step, "expected")) unexpected = true;
      }
    }
  }
  out += "<div class=\"callout hang\" id=\"hang\"><strong class=\"head\">" +
         std::string(unexpected ? "Hang" : "Hang (expected by the scenario)");
  if (!facts.stage.empty()) out += " in " + esc(facts.stage);
  if (!facts.hangSteps.empty()) {
    std::vector<long long> steps(facts.hangSteps.begin(), facts.hangSteps.end());
    out += fmt::format(", step{} {}", steps.size() > 1 ? "s" : "", esc(rangesOf(steps)));
  }
  out += "</strong>";
  if (!waiting.empty())
    out += "Waiting: rank" + std::string(waiting.size() > 1 ? "s " : " ") + esc(rangesOf(waiting)) +
           ". ";
  if (!missing.empty()) {
    out += "<strong>Missing: rank" + std::string(missing.size() > 1 ? "s " : " ") +
           esc(rangesOf(missing)) + "</strong> (never arrived). ";
  }
  out +=
      "<br><span class=\"mono\">" + esc(clip(textOf(hang, "diagnosis"), 600)) + "</span></div>\n";
}

// "rank 3: <why>" for each rank that crashed.
std::vector<std::string> crashesOf(const json& report) {
  std::vector<std::string> crashes;
  if (const json* ranks = arrayOf(report, "ranks")) {
    for (const auto& rank : *ranks) {
      if (!flag(rank, "crashed")) continue;
      crashes.push_back(fmt::format("rank {}: {}", integerOf(rank, "rank").value_or(-1),
                                    clip(textOf(rank, "crash_reason", "crashed"), 400)));
    }
  }
  return crashes;
}

void crashCallout(std::string& out, const std::vector<std::string>& crashes) {
  if (crashes.empty()) return;
  out += fmt::format(
      "<div class=\"callout crash\" id=\"crash\"><strong class=\"head\">{} "
      "rank{} crashed</strong>",
      crashes.size(), crashes.size() > 1 ? "s" : "");
  for (std::size_t i = 0; i < crashes.size() && i < kMaxTableRanks; ++i) {
    out += "<div class=\"mono\">" + esc(crashes[i]) + "</div>";
  }
  if (crashes.size() > kMaxTableRanks) {
    out += fmt::format("<div class=\"note\">{} more not listed</div>",
                       crashes.size() - kMaxTableRanks);
  }
  out += "</div>\n";
}

void mismatchCallout(std::string& out, const json& report) {
  const json* mismatches = arrayOf(report, "mismatches");
  if (mismatches == nullptr || mismatches->empty()) return;
  out += fmt::format(
      "<div class=\"callout fail\" id=\"mismatches\"><strong class=\"head\">{} "
      "collective mismatch{}</strong>",
      mismatches->size(), mismatches->size() > 1 ? "es" : "");
  std::size_t shown = 0;
  for (const auto& m : *mismatches) {
    if (++shown > 16) break;
    out += fmt::format("<div class=\"mono\">rank {} step {}: {}</div>",
                       integerOf(m, "rank").value_or(-1), integerOf(m, "step").value_or(-1),
                       esc(clip(textOf(m, "message"), 400)));
  }
  if (mismatches->size() > 16) {
    out += fmt::format("<div class=\"note\">{} more in the JSON report</div>",
                       mismatches->size() - 16);
  }
  out += "</div>\n";
}

// Whether a rank's leaks were checked (its automatic shutdown ran); a report without the field
// checked every rank.
bool checkedRank(const json& rank) { return !rank.contains("checked") || flag(rank, "checked"); }
// A rank that left resources behind after a shutdown that ran. The report's `leaked` also counts
// what an unchecked rank held when it stopped; the page, as the console, calls that unchecked.
bool leakedWhenChecked(const json& rank) { return flag(rank, "leaked") && checkedRank(rank); }

// Leaks: what a run left behind, and what grew over its cycles (details further down).
void leakCallouts(std::string& out, const json& report, const std::string& id) {
  const json& leakSection = objectOf(child(report, "leaks"));
  std::vector<long long> leaking;
  for (const auto& rank : objectOf(arrayOf(leakSection, "ranks"))) {
    if (leakedWhenChecked(rank)) leaking.push_back(integerOf(rank, "rank").value_or(-1));
  }
  if (!leaking.empty()) {
    out += fmt::format(
        "<div class=\"callout leak\"><strong class=\"head\">Resources left "
        "behind</strong>rank{} {} still held groups or workspaces at the end "
        "(<a href=\"#{}-leaks\">leaks</a>).</div>\n",
        leaking.size() == 1 ? "" : "s", esc(rangesOf(leaking)), id);
  }
  const json* trends = child(report, "leak_trends");
  if (trends == nullptr) return;
  const json* texts = arrayOf(*trends, "leaks");
  if (texts == nullptr || texts->empty()) return;
  out += fmt::format(
      "<div class=\"callout leak\" id=\"{}-leak-summary\"><strong "
      "class=\"head\">Leak: {} series grow{} over the cycles</strong>",
      id, texts->size(), texts->size() == 1 ? "s" : "");
  std::size_t shown = 0;
  for (const auto& text : *texts) {
    if (shown++ >= 8) break;
    out += "<div>" + esc(text.is_string() ? text.get<std::string>() : text.dump()) + "</div>";
  }
  if (texts->size() > 8) out += fmt::format("<div class=\"note\">{} more</div>", texts->size() - 8);
  out += fmt::format("<a href=\"#{}-leak-trends\">the trend plots</a></div>\n", id);
}

// The unexpected steps themselves, the first few: what failed, where, and its message.
void unexpectedCallout(std::string& out, const json& report, const std::string& id) {
  std::vector<std::string> failed;
  std::size_t unexpected = 0;
  for (const auto& rank : objectOf(arrayOf(report, "ranks"))) {
    for (const auto& step : objectOf(arrayOf(rank, "steps"))) {
      if (flag(step, "expected")) continue;
      if (++unexpected > 8) continue;
      std::string line = fmt::format("rank {} step {} {}", integerOf(rank, "rank").value_or(-1),
                                     integerOf(step, "index").value_or(-1), textOf(step, "op"));
      if (!textOf(step, "module").empty()) line += " " + textOf(step, "module");
      line += ": " + textOf(step, "status");
      if (const json* error = child(step, "error")) {
        line += " (" + textOf(*error, "kind") + "): " + clip(textOf(*error, "message"), 300);
      }
      failed.push_back(std::move(line));
    }
  }
  // A run failed by its leak trend alone has no such step: the leak's box says why.
  const json* trends = child(report, "leak_trends");
  const std::string trendFailure = trends ? textOf(*trends, "failure") : std::string();
  if (unexpected == 0 && !trendFailure.empty()) {
    out += "<div class=\"callout fail\" id=\"" + id +
           "-unexpected\"><strong class=\"head\">Every step met its expectation; the leak "
           "trend failed the run</strong><div>" +
           esc(clip(trendFailure, 600)) + "</div></div>\n";
    return;
  }
  out += fmt::format(
      "<div class=\"callout fail\" id=\"{}-unexpected\"><strong class=\"head\">{} step{} did not "
      "meet {} expectation</strong>",
      id, unexpected, unexpected == 1 ? "" : "s", unexpected == 1 ? "its" : "their");
  for (const auto& line : failed) out += "<div class=\"mono\">" + esc(line) + "</div>";
  if (unexpected > failed.size()) {
    out += fmt::format("<div class=\"note\">{} more</div>", unexpected - failed.size());
  }
  out += "<div class=\"note\">Outlined in black in the timeline below.</div></div>\n";
}

// What a reader needs first: the hang (who waits where, who is missing), crashes, mismatches.
void summaryCallouts(std::string& out, const json& report, const HangFacts& facts,
                     const std::string& id) {
  const std::string outcome = outcomeOf(report);
  if (outcome == "invalid") {
    invalidCallout(out, report);
    return;
  }
  if (const json* hang = child(report, "hang"); hang != nullptr && hang->is_object()) {
    hangCallout(out, report, *hang, facts);
  }
  const std::vector<std::string> crashes = crashesOf(report);
  crashCallout(out, crashes);
  mismatchCallout(out, report);
  leakCallouts(out, report, id);
  if (outcome == "pass" && child(report, "hang") == nullptr && crashes.empty()) {
    out +=
        "<div class=\"callout pass\"><strong class=\"head\">Every step on every rank met its "
        "expectation</strong></div>\n";
  } else if (outcome == "fail" && crashes.empty()) {
    unexpectedCallout(out, report, id);
  }
}

// What a timeline drew, so that its legend names only that.
struct Drawn {
  std::set<std::string> statuses;
  bool dead = false, crash = false, unexpected = false, hung = false, missing = false;
  bool cause = false, follows = false;  // a rank's part in the first failure
};

// A rank's part in the first failure as its timeline label's background: filled for the ranks
// it names, outlined for those whose failure follows from it.
constexpr const char* kCauseFill = "#F9D3BF";
constexpr const char* kFollowsStroke = "#D55E00";

void timelineLegend(std::string& out, const Drawn& drawn) {
  out += "<div class=\"legend\">";
  for (const auto& style : kStatusStyles) {
    if (drawn.statuses.count(style.status) == 0) continue;
    out +=
        fmt::format("<span><span class=\"sw\" style=\"background:{};color:{}\">{}</span>{}</span>",
                    style.fill, style.ink, style.mark, style.legend);
  }
  if (drawn.dead) {
    out +=
        "<span><span class=\"sw\" style=\"background:repeating-linear-gradient(45deg,#fff,#fff "
        "3px,#999 3px,#999 5px)\"></span>no result (the rank process died)</span>";
  }
  if (drawn.crash) {
    out +=
        "<span><span class=\"sw\" style=\"background:#D55E00;width:5px;border:1px solid "
        "#000\"></span>where a rank crashed</span>";
  }
  if (drawn.unexpected) {
    out +=
        "<span><span class=\"sw\" style=\"border:3px solid #000\"></span>unexpected "
        "(did not meet the step's expect)</span>";
  }
  if (drawn.hung) {
    out +=
        "<span><span class=\"sw\" style=\"border:2px dashed #8E3B74;background:#fff\"></span>the "
        "hung step</span>";
  }
  if (drawn.missing) {
    out +=
        "<span><span class=\"sw\" style=\"border:2px dashed #000;background:#fff;color:#000\">?"
        "</span>missing rank (never arrived)</span>";
  }
  if (drawn.cause) {
    out += fmt::format(
        "<span><span class=\"sw\" style=\"background:{};border:2px solid {}\"></span>the "
        "first failure (the rank it names)</span>",
        kCauseFill, kFollowsStroke);
  }
  if (drawn.follows) {
    out += fmt::format(
        "<span><span class=\"sw\" style=\"background:#fff;border:2px dashed {}\"></span>"
        "follows from the first failure</span>",
        kFollowsStroke);
  }
  out += "</div>\n";
}

// The steps' outline: from the first rank that has each step.
std::vector<const json*> stepOutline(const json& ranks) {
  std::vector<const json*> outline;
  for (const auto& rank : ranks) {
    const json* steps = arrayOf(rank, "steps");
    if (steps == nullptr) continue;
    for (std::size_t i = outline.size(); i < steps->size(); ++i) outline.push_back(&(*steps)[i]);
  }
  return outline;
}

// Whether a rank's row has something to see: a crash, a part in the hang, a step that failed.
bool hasProblem(const json& rank, const HangFacts& facts) {
  if (flag(rank, "crashed") || flag(rank, "stopped")) return true;
  const long long r = integerOf(rank, "rank").value_or(-1);
  if (facts.roles.count(r) != 0 || facts.parts.of(r) != FailurePart::kNone) return true;
  for (const auto& step : objectOf(arrayOf(rank, "steps"))) {
    if (!flag(step, "expected") || textOf(step, "status") == "hang" ||
        textOf(step, "status") == "error") {
      return true;
    }
  }
  return false;
}

// The ranks a timeline draws, as indices into the report's ranks, in rank order.
struct ShownRanks {
  std::vector<std::size_t> indices;
  std::size_t problems = 0;  // how many of them were taken for a problem
};

// Ranks with something to see first, then the others in rank order, within the bound.
ShownRanks shownRanksOf(const json& ranks, const HangFacts& facts) {
  ShownRanks shown;
  for (std::size_t i = 0; i < ranks.size() && shown.indices.size() < kMaxTimelineRanks; ++i) {
    if (hasProblem(ranks[i], facts)) shown.indices.push_back(i);
  }
  shown.problems = shown.indices.size();
  for (std::size_t i = 0; i < ranks.size() && shown.indices.size() < kMaxTimelineRanks; ++i) {
    if (!hasProblem(ranks[i], facts)) shown.indices.push_back(i);
  }
  std::sort(shown.indices.begin(), shown.indices.end());
  return shown;
}

// The first step drawn: a window of steps around the first problem when there are too many.
std::size_t firstStepShown(const json& ranks, const std::vector<std::size_t>& shownRanks,
                           std::size_t stepCount) {
  if (stepCount <= kMaxTimelineSteps) return 0;
  std::size_t firstProblem = 0;
  bool found = false;
  for (const auto index : shownRanks) {
    for (const auto& step : objectOf(arrayOf(ranks[index], "steps"))) {
      if (!flag(step, "expected") || textOf(step, "status") == "hang") {
        const auto at =
            static_cast<std::size_t>(std::max<long long>(0, integerOf(step, "index").value_or(0)));
        if (!found || at < firstProblem) firstProblem = at;
        found = true;
        break;
      }
    }
  }
  if (found && firstProblem >= kMaxTimelineSteps / 2) {
    return std::min(firstProblem - kMaxTimelineSteps / 2, stepCount - kMaxTimelineSteps);
  }
  return 0;
}

// What a timeline draws and where: its window of steps, its rows and the sizes of its parts,
// shared by the functions that draw them.
struct TimelineGrid {
  std::size_t stepCount = 0;   // the run's top-level steps, drawn or not
  std::size_t firstStep = 0;   // the step in the first column
  std::size_t shownSteps = 0;  // columns
  std::size_t rows = 0;
  double labelW = 170;  // the ranks' labels, at the left
  double noteW = 390;   // what the hang diagnosis says of each rank, at the right
  double cellW = 0;
  double cellH = 0;
  bool wide = false;  // room for each step's op and module above its column
  double topH = 0;
  double gridW = 0;
  double width = 0;
  double height = 0;
  double fontSize = 0;
};

TimelineGrid timelineGrid(std::size_t stepCount, std::size_t firstStep, std::size_t rows) {
  TimelineGrid grid;
  grid.stepCount = stepCount;
  grid.firstStep = firstStep;
  grid.shownSteps = std::min(stepCount, kMaxTimelineSteps);
  grid.rows = rows;
  grid.cellW = std::clamp(820.0 / static_cast<double>(std::max<std::size_t>(1, grid.shownSteps)),
                          6.0, 110.0);
  grid.cellH = rows <= 12 ? 30 : rows <= 32 ? 18 : 11;
  grid.wide = grid.cellW >= 64;
  grid.topH = grid.wide ? 56 : 36;
  grid.gridW = grid.cellW * static_cast<double>(std::max<std::size_t>(1, grid.shownSteps));
  grid.width = grid.labelW + grid.gridW + grid.noteW;
  grid.height = grid.topH + grid.cellH * static_cast<double>(rows) + 12;
  grid.fontSize = grid.cellH >= 18 ? 13 : 10;
  return grid;
}

// The picture's start and its column headers: the step index, and op and module when there
// is room.
void timelineHeader(std::string& out, const TimelineGrid& grid,
                    const std::vector<const json*>& outline, const std::string& id) {
  out += "<div class=\"scroll\"><svg id=\"" + id + "-timeline\" class=\"timeline\" role=\"img\" " +
         "aria-label=\"per-rank timeline of the steps\" width=\"" + px(grid.width) +
         "\" height=\"" + px(grid.height) + "\" viewBox=\"0 0 " + px(grid.width) + " " +
         px(grid.height) + "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  out += "<defs><pattern id=\"" + id +
         "-dead\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
         "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#fff\"/><rect "
         "width=\"2\" height=\"6\" fill=\"#9aa0a6\"/></pattern></defs>\n";
  const std::size_t every =
      grid.cellW >= 22 ? 1 : static_cast<std::size_t>(std::ceil(22.0 / grid.cellW));
  for (std::size_t s = 0; s < grid.shownSteps; ++s) {
    const std::size_t index = grid.firstStep + s;
    const double x = grid.labelW + grid.cellW * static_cast<double>(s) + grid.cellW / 2;
    if (index % every == 0 || grid.wide) {
      out += fmt::format(
          "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" "
          "fill=\"#57606a\">{}</text>",
          px(x), px(grid.wide ? 18 : grid.topH - 8), index);
    }
    if (grid.wide) {
      const json& step = *outline[index];
      std::string name = textOf(step, "op");
      const std::string module = textOf(step, "module");
      out += fmt::format(
          "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" "
          "font-weight=\"600\">{}</text>",
          px(x), px(34), esc(name));
      if (!module.empty()) {
        out += fmt::format(
            "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\" "
            "fill=\"#57606a\">{}</text>",
            px(x), px(48), esc(module.size() > 14 ? module.substr(0, 13) + "\u2026" : module));
      }
    }
  }
  out += fmt::format("<text x=\"4\" y=\"{}\" font-size=\"12\" fill=\"#57606a\">step</text>\n",
                     px(grid.wide ? 18 : grid.topH - 8));
}

// One rank's row of a timeline: the rank, the top of its row, its part in the hang.
struct TimelineRow {
  const json& rank;
  long long r;
  double y;
  Role role;
};

// A cell's tooltip: the step, its status and time, its error and label.
std::string cellTip(const json& step, long long r, std::size_t index) {
  const std::string status = textOf(step, "status", "?");
  const bool expected = flag(step, "expected");
  std::string tip = fmt::format("rank {} \u00b7 step {} {}", r, index, textOf(step, "op"));
  if (!textOf(step, "module").empty()) tip += " " + textOf(step, "module");
  tip += fmt::format(": {}{}", status, expected ? "" : " (UNEXPECTED)");
  if (const auto seconds = numberOf(step, "seconds"); seconds && *seconds > 0) {
    tip += " in " + formatSeconds(*seconds);
  }
  if (const json* error = child(step, "error")) {
    tip += "\n" + textOf(*error, "kind") + ": " + clip(textOf(*error, "message"), 400);
  }
  if (!textOf(step, "label").empty()) tip += "\nlabel: " + textOf(step, "label");
  return tip;
}

// A rank's cells, coloured by status, marked, and outlined in black where unexpected.
void timelineCells(std::string& out, const TimelineGrid& grid, const TimelineRow& row,
                   const json& steps, const HangFacts& facts, Drawn& drawn) {
  const double y = row.y;
  for (std::size_t s = 0; s < grid.shownSteps && grid.firstStep + s < steps.size(); ++s) {
    const json& step = steps[grid.firstStep + s];
    const std::string status = textOf(step, "status", "?");
    const StatusStyle& style = styleOf(status);
    const double x = grid.labelW + grid.cellW * static_cast<double>(s);
    const bool expected = flag(step, "expected");
    drawn.statuses.insert(status);
    drawn.unexpected = drawn.unexpected || !expected;
    const double inset = expected ? 1 : 2.5;
    out += fmt::format(
        "<rect class=\"cell s-{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
        "fill=\"{}\"{}><title>{}</title></rect>",
        esc(status), px(x + inset), px(y + inset), px(grid.cellW - 2 * inset),
        px(grid.cellH - 2 * inset), style.fill,
        expected ? "" : " stroke=\"#000\" stroke-width=\"3\"",
        esc(cellTip(step, row.r, grid.firstStep + s)));
    if (*style.mark != '\0' && grid.cellW >= 14 && grid.cellH >= 14) {
      out += fmt::format(
          "<text x=\"{}\" y=\"{}\" font-size=\"{}\" text-anchor=\"middle\" "
          "fill=\"{}\" pointer-events=\"none\">{}</text>",
          px(x + grid.cellW / 2), px(y + grid.cellH / 2 + grid.fontSize / 2 - 1), grid.fontSize,
          style.ink, style.mark);
    }
    // A missing rank at a hung step: it never arrived there.
    if (row.role == Role::kMissing &&
        facts.hangSteps.count(static_cast<long long>(grid.firstStep + s))) {
      drawn.missing = true;
      out += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff\" "
          "stroke=\"#000\" stroke-width=\"2\" stroke-dasharray=\"4 3\"><title>"
          "rank {} never arrived at this step's collective</title></rect>",
          px(x + 3), px(y + 3), px(grid.cellW - 6), px(grid.cellH - 6), row.r);
      if (grid.cellW >= 14 && grid.cellH >= 14) {
        out += fmt::format(
            "<text x=\"{}\" y=\"{}\" font-size=\"{}\" font-weight=\"700\" "
            "text-anchor=\"middle\">?</text>",
            px(x + grid.cellW / 2), px(y + grid.cellH / 2 + grid.fontSize / 2 - 1), grid.fontSize);
      }
    }
  }
}

// Where a rank that crashed stopped: after the last step it ran.
void crashMark(std::string& out, const TimelineGrid& grid, const TimelineRow& row,
               const json& steps, Drawn& drawn) {
  long long last = -1;
  for (const auto& step : steps) {
    const std::string status = textOf(step, "status");
    if (status != "skipped" && status != "not_run") last = integerOf(step, "index").value_or(last);
  }
  const long long column = last - static_cast<long long>(grid.firstStep);
  if (column < 0 || column >= static_cast<long long>(grid.shownSteps)) return;
  const double x = grid.labelW + grid.cellW * static_cast<double>(column + 1);
  drawn.crash = true;
  out += fmt::format(
      "<rect class=\"crash-mark\" x=\"{}\" y=\"{}\" width=\"5\" "
      "height=\"{}\" fill=\"#D55E00\" stroke=\"#000\" stroke-width=\"0.8\">"
      "<title>rank {} crashed here: {}</title></rect>",
      px(x - 2.5), px(row.y - 2), px(grid.cellH + 4), row.r,
      esc(clip(textOf(row.rank, "crash_reason", "crashed"), 400)));
}

// `note` in at most `maxLines` lines of `room` bytes, cut at a word where one is near the end,
// with an ellipsis where something was left out.
std::vector<std::string> noteLines(const std::string& note, std::size_t room,
                                   std::size_t maxLines) {
  std::vector<std::string> lines;
  std::string rest = note;
  while (!rest.empty() && lines.size() < maxLines) {
    if (rest.size() <= room) {
      lines.push_back(rest);
      rest.clear();
      break;
    }
    std::size_t cut = rest.rfind(' ', room);
    if (cut == std::string::npos || cut < room / 2) cut = room;
    lines.push_back(rest.substr(0, cut));
    rest = rest.substr(std::min(rest.size(), cut + 1));
  }
  if (!rest.empty() && !lines.empty()) {
    auto& last = lines.back();
    while (!last.empty() && (last.back() & 0xC0) == 0x80) last.pop_back();  // UTF-8 whole
    if (last.size() + 1 > room && !last.empty()) last.pop_back();
    last += "\u2026";
  }
  return lines;
}

// The rank's part in the first failure, then what the hang diagnosis says of it or its crash, at
// the right.
void rowNote(std::string& out, const TimelineGrid& grid, const TimelineRow& row,
             const HangFacts& facts) {
  std::string note;
  if (facts.byRank.count(row.r)) {
    note = facts.byRank.at(row.r);
  } else if (flag(row.rank, "crashed")) {
    note = "crashed: " + clip(textOf(row.rank, "crash_reason"), 400);
  } else if (flag(row.rank, "stopped")) {
    note = "stopped: " + clip(textOf(row.rank, "stop_reason"), 400);
  }
  const FailurePart part = facts.parts.of(row.r);
  if (part != FailurePart::kNone) {
    note = failurePartWords(part) + (note.empty() ? "" : ": " + note);
  }
  if (note.empty() || grid.cellH < 11) return;
  const double noteFont = std::min(grid.fontSize, 12.0);
  const auto room = static_cast<std::size_t>(grid.noteW / (noteFont * 0.55));
  // Two lines where the row has room for them.
  const std::vector<std::string> lines = noteLines(note, room, grid.cellH >= 26 ? 2 : 1);
  const char* colour = part == FailurePart::kCause  ? "#A33C00"
                       : row.role == Role::kMissing ? "#000"
                       : row.role == Role::kWaiting ? "#8E3B74"
                       : row.role == Role::kCrashed ? "#A33C00"
                                                    : "#57606a";
  const double first =
      row.y + grid.cellH / 2 + noteFont / 2 - 2 - (lines.size() > 1 ? noteFont * 0.55 : 0);
  const double x = grid.labelW + grid.gridW + 10;
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"{}\" fill=\"{}\" font-weight=\"{}\">"
      "<title>{}</title>",
      px(x), px(first), noteFont, colour,
      row.role == Role::kMissing || part == FailurePart::kCause ? "700" : "400", esc(note));
  for (std::size_t l = 0; l < lines.size(); ++l) {
    out += fmt::format("<tspan x=\"{}\" dy=\"{}\">{}</tspan>", px(x),
                       l == 0 ? "0" : px(noteFont * 1.15), esc(lines[l]));
  }
  out += "</text>";
}

// A rank's row: its label, its cells (a hatched bar where it reported no step), where it
// crashed, and the diagnosis's note on it.
void timelineRow(std::string& out, const TimelineGrid& grid, const TimelineRow& row,
                 const HangFacts& facts, const std::string& id, Drawn& drawn) {
  std::string label = fmt::format("rank {}", row.r);
  const std::string host = textOf(row.rank, "host");
  if (!host.empty() && grid.cellH >= 18)
    label += " \u00b7 " + (host.size() > 14 ? host.substr(0, 13) + "\u2026" : host);
  const FailurePart part = facts.parts.of(row.r);
  if (part == FailurePart::kCause || part == FailurePart::kFollows) {
    const bool cause = part == FailurePart::kCause;
    drawn.cause = drawn.cause || cause;
    drawn.follows = drawn.follows || !cause;
    out += fmt::format(
        "<rect class=\"part part-{}\" x=\"1\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"3\" "
        "fill=\"{}\" stroke=\"{}\" stroke-width=\"2\"{}><title>rank {}: {}</title></rect>",
        failurePartClass(part), px(row.y + 1.5), px(grid.labelW - 6), px(grid.cellH - 3),
        cause ? kCauseFill : "#fff", kFollowsStroke, cause ? "" : " stroke-dasharray=\"4 3\"",
        row.r, failurePartWords(part));
  }
  out += fmt::format(
      "<text class=\"rank-label{}\" x=\"6\" y=\"{}\" font-size=\"{}\" font-weight=\"{}\">{}"
      "</text>",
      part == FailurePart::kNone ? "" : std::string(" part-") + failurePartClass(part),
      px(row.y + grid.cellH / 2 + grid.fontSize / 2 - 2), grid.fontSize,
      row.role == Role::kNone && part != FailurePart::kCause ? "400" : "700", esc(label));
  const json* steps = arrayOf(row.rank, "steps");
  if (steps == nullptr || steps->empty()) {
    drawn.dead = true;
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#{}-dead)\" "
        "stroke=\"#57606a\"><title>{}</title></rect>",
        px(grid.labelW), px(row.y + 1), px(grid.gridW), px(grid.cellH - 2), id,
        esc(fmt::format("rank {}: no result ({})", row.r,
                        clip(flag(row.rank, "stopped")
                                 ? textOf(row.rank, "stop_reason")
                                 : textOf(row.rank, "crash_reason", "no steps reported"),
                             400))));
  } else {
    timelineCells(out, grid, row, *steps, facts, drawn);
    if (flag(row.rank, "crashed")) crashMark(out, grid, row, *steps, drawn);
  }
  rowNote(out, grid, row, facts);
  out += "\n";
}

// The hung steps' columns, outlined across every row.
void hungColumns(std::string& out, const TimelineGrid& grid, const HangFacts& facts, Drawn& drawn) {
  const auto first = static_cast<long long>(grid.firstStep);
  for (const long long hung : facts.hangSteps) {
    if (hung < first || hung >= first + static_cast<long long>(grid.shownSteps)) continue;
    const double x = grid.labelW + grid.cellW * static_cast<double>(hung - first);
    drawn.hung = true;
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
        "stroke=\"#8E3B74\" stroke-width=\"2.5\" stroke-dasharray=\"6 4\"/>",
        px(x - 1), px(grid.topH - 3), px(grid.cellW + 2),
        px(grid.cellH * static_cast<double>(grid.rows) + 6));
  }
}

// How to read the timeline, and what it left out.
void timelineNote(std::string& out, const TimelineGrid& grid, std::size_t rankCount,
                  std::size_t problems) {
  std::string left;
  if (rankCount > grid.rows) {
    left += fmt::format("{} of {} ranks drawn (every rank with a problem first: {}); ", grid.rows,
                        rankCount, problems);
  }
  if (grid.stepCount > grid.shownSteps) {
    left += fmt::format("steps {}-{} of {} drawn; ", grid.firstStep,
                        grid.firstStep + grid.shownSteps - 1, grid.stepCount);
  }
  out +=
      "<p class=\"note\">One column per top-level step in order (not to scale in time; hover a "
      "cell for its time and error). ";
  if (!left.empty())
    out += "<strong>Left out:</strong> " + esc(left.substr(0, left.size() - 2)) + ".";
  out += "</p>\n";
}

// One column per step, one row per rank, each cell coloured by the step's status.
void timeline(std::string& out, const json& report, const HangFacts& facts, const std::string& id) {
  const json* ranks = arrayOf(report, "ranks");
  if (ranks == nullptr || ranks->empty()) return;
  const std::vector<const json*> outline = stepOutline(*ranks);
  const ShownRanks shown = shownRanksOf(*ranks, facts);
  const TimelineGrid grid = timelineGrid(
      outline.size(), firstStepShown(*ranks, shown.indices, outline.size()), shown.indices.size());
  timelineHeader(out, grid, outline, id);
  Drawn drawn;
  for (std::size_t row = 0; row < grid.rows; ++row) {
    const json& rank = (*ranks)[shown.indices[row]];
    const long long r =
        integerOf(rank, "rank").value_or(static_cast<long long>(shown.indices[row]));
    const Role role = facts.roles.count(r) ? facts.roles.at(r) : Role::kNone;
    const TimelineRow drawnRow{rank, r, grid.topH + grid.cellH * static_cast<double>(row), role};
    timelineRow(out, grid, drawnRow, facts, id, drawn);
  }
  hungColumns(out, grid, facts, drawn);
  out += "</svg></div>\n";
  timelineLegend(out, drawn);
  timelineNote(out, grid, ranks->size(), shown.problems);
}

// One kind of bind's measured times, warm-up repetitions left out.
struct BindTimes {
  std::string name, title;
  std::vector<double> values;
};

// Fresh binds, then reused binds.
std::vector<BindTimes> bindTimesOf(const json& samples, long long warmup) {
  const json& metrics = objectOf(child(samples, "metrics"));
  std::vector<BindTimes> rows;
  for (const auto& [name, title] : {std::pair<std::string, std::string>{"fresh_bind", "fresh bind"},
                                    {"reused_bind", "reused bind"}}) {
    const json* metric = child(metrics, name);
    const json* reps = metric != nullptr ? arrayOf(*metric, "per_repetition") : nullptr;
    BindTimes row{name, title, {}};
    if (reps != nullptr) {
      for (std::size_t r = 0; r < reps->size(); ++r) {
        if (static_cast<long long>(r) < warmup && static_cast<long long>(reps->size()) > warmup)
          continue;
        for (const double v : numbersOf(&(*reps)[r])) {
          if (v > 0) row.values.push_back(v);
        }
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// The sizes of the bind-time plot: a row per kind of bind, the time axis under them, each
// row's count, median and p95 at the right.
struct BindPlot {
  double width = 900, labelW = 110, rowH = 60, topH = 10, axisH = 34, statsW = 230;
};
constexpr const char* kBindColours[] = {"#0072B2", "#E69F00"};

// The i-th kind of bind: its name, its dots, its middle half as a box, its median as a bar.
void bindRow(std::string& out, const BindPlot& plot, const Axis& axis, const BindTimes& row,
             std::size_t i) {
  const char* colour = kBindColours[i % 2];
  const double mid = plot.topH + plot.rowH * (static_cast<double>(i) + 0.5);
  out += fmt::format(
      "<text x=\"4\" y=\"{}\" font-size=\"14\" font-weight=\"600\" fill=\"{}\">"
      "{}</text>",
      px(mid + 5), colour, esc(row.title));
  if (row.values.empty()) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"#57606a\">no {}s</text>",
                       px(plot.labelW + 4), px(mid + 5), esc(row.title));
    return;
  }
  const double q1 = quantile(row.values, 0.25), q2 = quantile(row.values, 0.5),
               q3 = quantile(row.values, 0.75), p95 = quantile(row.values, 0.95);
  if (row.values.size() >= 5) {  // a box of fewer values says nothing the dots do not
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
        "fill-opacity=\"0.15\" stroke=\"{}\"/>",
        px(axis(q1)), px(mid - 18), px(std::max(1.0, axis(q3) - axis(q1))), px(36), colour, colour);
  }
  const auto dots = thinned(row.values, kMaxDots);
  for (std::size_t d = 0; d < dots.size(); ++d) {
    out += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2.6\" fill=\"{}\" fill-opacity=\"0.7\"/>",
                       px(axis(dots[d])), px(mid + jitter(d + i * 7919) * 14), colour);
  }
  out += fmt::format(
      "<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#1b1f24\" "
      "stroke-width=\"3\"><title>median {3}</title></line>",
      px(axis(q2)), px(mid - 22), px(mid + 22), esc(formatSeconds(q2)));
  const double statsX = plot.width - plot.statsW + 6;
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"13\">n={} \u00b7 median {}</text>"
      "<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#57606a\">p95 {}{}</text>",
      px(statsX), px(mid - 2), row.values.size(), esc(formatSeconds(q2)), px(statsX), px(mid + 15),
      esc(formatSeconds(p95)),
      dots.size() < row.values.size() ? fmt::format(" \u00b7 {} dots drawn", dots.size()) : "");
}

// Every kind of bind on one log axis of seconds.
void bindPlot(std::string& out, const std::vector<BindTimes>& rows, const std::string& id) {
  double low = 1e300, high = 0;
  for (const auto& row : rows) {
    for (const double v : row.values) {
      low = std::min(low, v);
      high = std::max(high, v);
    }
  }
  low /= 1.5;
  high *= 1.5;
  const BindPlot plot{};
  const Axis axis{low, high, plot.labelW, plot.width - plot.statsW - 10, true};
  const double height = plot.topH + plot.rowH * static_cast<double>(rows.size()) + plot.axisH;
  out += "<svg id=\"" + id +
         "-binds\" class=\"dist\" role=\"img\" aria-label=\"fresh and reused "
         "bind times\" width=\"" +
         px(plot.width) + "\" height=\"" + px(height) + "\" viewBox=\"0 0 " + px(plot.width) + " " +
         px(height) + "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  const double plotBottom = plot.topH + plot.rowH * static_cast<double>(rows.size());
  for (const double tick : axis.ticks(5)) {
    const double x = axis(tick);
    out += fmt::format(
        "<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#e4e7eb\"/>"
        "<text x=\"{0}\" y=\"{3}\" font-size=\"12\" text-anchor=\"middle\" "
        "fill=\"#57606a\">{4}</text>",
        px(x), px(plot.topH), px(plotBottom + 4), px(plotBottom + 18), esc(formatSeconds(tick)));
  }
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" "
      "fill=\"#57606a\">seconds per bind (log scale)</text>\n",
      px((axis.x0 + axis.x1) / 2), px(plotBottom + 32));
  for (std::size_t i = 0; i < rows.size(); ++i) bindRow(out, plot, axis, rows[i], i);
  out += "</svg>\n";
}

// The plot's legend, and what it shows: which repetitions, and the speed-up of reuse.
void bindNote(std::string& out, const json& report, long long warmup) {
  out +=
      "<div class=\"legend\"><span><span class=\"sw\" style=\"background:#0072B2\"></span>"
      "fresh bind (a new workspace)</span><span><span class=\"sw\" style=\"background:"
      "#E69F00\"></span>reused bind (a recycled idle workspace)</span><span><span class=\"sw\" "
      "style=\"background:#1b1f24;width:4px\"></span>median</span><span><span class=\"sw\" "
      "style=\"background:#0072B226\"></span>middle half (25th-75th percentile)</span></div>\n";
  std::string note = "Every bind of every rank";
  if (warmup > 0)
    note += fmt::format(", without the {} warm-up repetition{}", warmup, warmup > 1 ? "s" : "");
  out += "<p class=\"note\">" + esc(note) + ".";
  if (const auto speedup = numberOf(objectOf(child(report, "timings")), "reuse_speedup_p50")) {
    out += fmt::format(
        " Reuse speed-up at the median (fresh p50 / reused p50): <strong>{:.2f}x"
        "</strong>.",
        *speedup);
  }
  out += "</p>\n";
}

// The summary table of every timing the report has.
void timingTable(std::string& out, const json& report) {
  const json& timings = objectOf(child(report, "timings"));
  bool header = false;
  for (const char* name : {"fresh_bind", "reused_bind", "close", "exchange"}) {
    const json* t = child(timings, name);
    if (t == nullptr) continue;
    if (!header) {
      out +=
          "<table class=\"timings\"><tr><th>timing</th><th>count</th><th>p50</th><th>p95</th>"
          "<th>max</th></tr>";
      header = true;
    }
    auto cell = [&](const char* key) {
      const auto v = numberOf(*t, key);
      return v ? formatSeconds(*v) : std::string("\u2013");
    };
    out += fmt::format(
        "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td "
        "class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
        name, integerOf(*t, "count").value_or(0), esc(cell("p50")), esc(cell("p95")),
        esc(cell("max")));
  }
  if (!header) return;
  out += "</table>\n";
  if (flag(timings, "approximate")) {
    out +=
        "<p class=\"note\">p50 and p95 are approximate (within 1%): the run kept more values "
        "than the report holds.</p>\n";
  }
}

// Fresh against reused binds: every measured value as a dot on a log axis, the middle half
// as a box, the median as a bar.
void timingDistributions(std::string& out, const json& report, const std::string& id) {
  const json& samples = objectOf(child(report, "samples"));
  const long long warmup = integerOf(samples, "warmup").value_or(0);
  const std::vector<BindTimes> rows = bindTimesOf(samples, warmup);
  out += "<h3 id=\"" + id + "-timings\">Bind times: fresh vs reused</h3>\n";
  const bool any =
      std::any_of(rows.begin(), rows.end(), [](const BindTimes& r) { return !r.values.empty(); });
  if (!any) {
    out +=
        "<p class=\"note\">No bind was timed (the report has no samples of fresh_bind or "
        "reused_bind).</p>\n";
  } else {
    bindPlot(out, rows, id);
    bindNote(out, report, warmup);
  }
  timingTable(out, report);
}

// A leak trend series as drawn: its points (at most kMaxDots of its values) and its fit.
struct Trend {
  std::string verdict, unit;
  long long warmup = 0;
  std::vector<std::pair<double, double>> points;  // (cycle, value)
  std::size_t values = 0;                         // before thinning
  std::size_t step = 1;                           // one point drawn per `step` values
  double lastCycle = 1;
  double fitFrom = 0;      // the first cycle fitted, after the warm-up
  double medianCycle = 0;  // where the band's slopes cross the fitted line
  std::optional<double> slope, intercept, ciLow, ciHigh;

  double fitted(double cycle) const { return *slope * cycle + *intercept; }
  // On the line of slope `s` through the median fitted point: an edge of the band.
  double banded(double s, double cycle) const {
    return fitted(medianCycle) + s * (cycle - medianCycle);
  }
};

Trend trendOf(const json& series, long long cycles, long long warmup) {
  Trend trend;
  trend.verdict = textOf(series, "verdict", "?");
  trend.unit = textOf(series, "unit", "count");
  // The series' own first fitted cycle where the report gives one (resident memory fits the
  // second half of the cycles), else the trend's warm-up.
  trend.warmup = std::max<long long>(
      warmup, static_cast<long long>(numberOf(series, "fit_from_cycle").value_or(0)));
  const double stride = std::max(1.0, numberOf(series, "cycle_stride").value_or(1));
  const std::vector<double> all = numbersOf(arrayOf(series, "values"));
  // Each point's cycle: the report's `cycles` (a process sampled every few cycles), else one
  // point per stride of cycles.
  const std::vector<double> at = numbersOf(arrayOf(series, "cycles"));
  const auto cycleOf = [&](std::size_t i) {
    return at.size() == all.size() ? at[i] : static_cast<double>(i) * stride;
  };
  trend.values = all.size();
  trend.step = all.size() > kMaxDots ? (all.size() + kMaxDots - 1) / kMaxDots : 1;
  for (std::size_t i = 0; i < all.size(); i += trend.step) {
    trend.points.emplace_back(cycleOf(i), all[i]);
  }
  trend.lastCycle = std::max<double>({1.0, static_cast<double>(cycles > 0 ? cycles - 1 : 0),
                                      all.empty() ? 0.0 : cycleOf(all.size() - 1)});
  trend.slope = numberOf(series, "slope_per_cycle");
  trend.intercept = numberOf(series, "intercept");
  trend.ciLow = numberOf(series, "ci_low");
  trend.ciHigh = numberOf(series, "ci_high");
  trend.fitFrom = std::clamp(static_cast<double>(trend.warmup), 0.0, trend.lastCycle);
  trend.medianCycle = (trend.fitFrom + trend.lastCycle) / 2;
  return trend;
}

// Where a trend plot draws: its size and margins, its cycle axis and its value scale.
struct TrendFrame {
  double width = 420, height = 220, left = 62, right = 12, top = 10, bottom = 36;
  Axis x;
  double low = 0, high = 1;

  double y(double v) const { return top + (high - v) / (high - low) * (height - top - bottom); }
};

// Values from every point, the fitted line and the band's corners, with a margin.
TrendFrame trendFrame(const Trend& trend) {
  double low = 1e300, high = -1e300;
  for (const auto& [c, v] : trend.points) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
  if (trend.slope && trend.intercept) {
    for (const double c : {trend.fitFrom, trend.lastCycle}) {
      low = std::min(low, trend.fitted(c));
      high = std::max(high, trend.fitted(c));
      if (trend.ciLow && trend.ciHigh) {
        for (const double s : {*trend.ciLow, *trend.ciHigh}) {
          const double v = trend.banded(s, c);
          low = std::min(low, v);
          high = std::max(high, v);
        }
      }
    }
  }
  if (low > high) {
    low = 0;
    high = 1;
  }
  if (high - low < 1e-9) {
    low -= 1;
    high += 1;
  }
  const double pad = (high - low) * 0.08;
  TrendFrame frame;
  frame.x = Axis{0, trend.lastCycle, frame.left, frame.width - frame.right, false};
  frame.low = low - pad;
  frame.high = high + pad;
  return frame;
}

// The plot's background: the warm-up greyed, the ticks of both axes, the border.
void trendAxes(std::string& out, const TrendFrame& f, const Trend& trend) {
  if (trend.warmup > 0) {
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#eceff1\"/>"
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#57606a\">warm-up</text>",
        px(f.x(0)), px(f.top), px(std::max(0.0, f.x(trend.fitFrom) - f.x(0))),
        px(f.height - f.top - f.bottom), px(f.x(0) + 3), px(f.top + 12));
  }
  for (const double tick : linearTicks(f.low, f.high, 4)) {
    out += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"#e4e7eb\"/>"
        "<text x=\"{3}\" y=\"{4}\" font-size=\"11\" text-anchor=\"end\" "
        "fill=\"#57606a\">{5}</text>",
        px(f.left), px(f.width - f.right), px(f.y(tick)), px(f.left - 4), px(f.y(tick) + 4),
        esc(formatValue(tick, trend.unit)));
  }
  for (const double tick : f.x.ticks(5)) {
    out += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\" "
        "fill=\"#57606a\">{:g}</text>",
        px(f.x(tick)), px(f.height - f.bottom + 14), tick);
  }
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\" "
      "fill=\"#57606a\">cycle</text>",
      px((f.left + f.width - f.right) / 2), px(f.height - 4));
  out += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
      "stroke=\"#d0d7de\"/>",
      px(f.left), px(f.top), px(f.width - f.left - f.right), px(f.height - f.top - f.bottom));
}

// The data over the background: the slope's confidence band, the values, the fitted line.
void trendMarks(std::string& out, const TrendFrame& f, const Trend& trend, double confidence) {
  const bool leak = trend.verdict == "leak";
  const char* lineColour = leak ? "#D55E00" : "#0072B2";
  const double from = trend.fitFrom, to = trend.lastCycle;
  if (trend.slope && trend.intercept && trend.ciLow && trend.ciHigh) {
    const double low = *trend.ciLow, high = *trend.ciHigh;
    out += fmt::format(
        "<polygon class=\"band\" points=\"{},{} {},{} {},{} {},{}\" fill=\"{}\" "
        "fill-opacity=\"0.18\"><title>{:g}% confidence interval of the slope: "
        "{:.4g} to {:.4g} per cycle</title></polygon>",
        px(f.x(from)), px(f.y(trend.banded(low, from))), px(f.x(to)),
        px(f.y(trend.banded(low, to))), px(f.x(to)), px(f.y(trend.banded(high, to))), px(f.x(from)),
        px(f.y(trend.banded(high, from))), lineColour, confidence * 100, low, high);
  }
  for (const auto& [cycle, value] : trend.points) {
    const bool warm = cycle < static_cast<double>(trend.warmup);
    out += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2.2\" fill=\"{}\"/>", px(f.x(cycle)),
                       px(f.y(value)), warm ? "#9aa0a6" : "#1b1f24");
  }
  if (trend.slope && trend.intercept) {
    out += fmt::format(
        "<line class=\"fit\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" "
        "stroke-width=\"2.5\"><title>fitted: {:.4g} per cycle</title></line>",
        px(f.x(from)), px(f.y(trend.fitted(from))), px(f.x(to)), px(f.y(trend.fitted(to))),
        lineColour, *trend.slope);
  }
}

// Under the plot: the slope and its interval, the threshold, how many values were drawn.
void trendFacts(std::string& out, const json& series, const Trend& trend, double confidence) {
  const std::string& unit = trend.unit;
  std::string facts;
  if (trend.slope) facts += fmt::format("slope {} per cycle", formatValue(*trend.slope, unit));
  if (trend.ciLow && trend.ciHigh) {
    facts += fmt::format(" ({:g}% CI {} to {})", confidence * 100, formatValue(*trend.ciLow, unit),
                         formatValue(*trend.ciHigh, unit));
  }
  if (const auto threshold = numberOf(series, "threshold_per_cycle")) {
    facts += fmt::format("{}a leak above {} per cycle", facts.empty() ? "" : "; ",
                         formatValue(*threshold, unit));
  }
  if (trend.step > 1) {
    facts += fmt::format("{}{} of {} values drawn", facts.empty() ? "" : "; ", trend.points.size(),
                         trend.values);
  }
  if (!facts.empty()) out += "<div class=\"note\">" + esc(facts) + "</div>";
}

// One small plot of a leak trend: values as dots, warm-up greyed, the fitted line and the band
// between the slopes of the confidence interval through the median fitted point.
void trendPlot(std::string& out, const json& series, long long cycles, long long warmup,
               double confidence) {
  const Trend trend = trendOf(series, cycles, warmup);
  const TrendFrame frame = trendFrame(trend);
  out += "<div class=\"plot trend t-" + esc(trend.verdict) + "\"><h4>";
  badge(out, trend.verdict);
  out += " " + esc(textOf(series, "text", textOf(series, "title"))) + "</h4>\n";
  out += "<svg role=\"img\" aria-label=\"leak trend\" width=\"" + px(frame.width) + "\" height=\"" +
         px(frame.height) + "\" viewBox=\"0 0 " + px(frame.width) + " " + px(frame.height) +
         "\" xmlns=\"http://www.w3.org/2000/svg\">";
  trendAxes(out, frame, trend);
  trendMarks(out, frame, trend, confidence);
  out += "</svg>\n";
  trendFacts(out, series, trend, confidence);
  out += "</div>\n";
}

void leaks(std::string& out, const json& report, const std::string& id) {
  const json* section = child(report, "leaks");
  const json* trends = child(report, "leak_trends");
  if (section == nullptr && trends == nullptr) return;
  out += "<h3 id=\"" + id + "-leaks\">Leaks</h3>\n";
  if (section != nullptr) {
    const json* ranks = arrayOf(*section, "ranks");
    std::vector<const json*> leaking;
    std::size_t unchecked = 0;
    if (ranks != nullptr) {
      for (const auto& rank : *ranks) {
        if (leakedWhenChecked(rank)) leaking.push_back(&rank);
        if (!checkedRank(rank)) ++unchecked;
      }
    }
    // One story with the console: a rank whose shutdown never ran was not checked, whatever it
    // still held when it stopped (the table lists that), so it is not called leaked.
    if (!leaking.empty()) {
      out += fmt::format(
          "<div class=\"callout leak\"><strong class=\"head\">{} rank{} left "
          "resources behind after the automatic shutdown</strong>",
          leaking.size(), leaking.size() == 1 ? "" : "s");
    } else if (unchecked > 0) {
      out += "<div class=\"callout\"><strong class=\"head\">Leaks not checked</strong>";
    } else {
      out +=
          "<div class=\"callout pass\"><strong class=\"head\">Nothing left behind after the "
          "automatic shutdown</strong>";
    }
    if (unchecked > 0) {
      out += fmt::format(
          "{} rank{} not checked (the shutdown runs only when every rank ended "
          "cleanly).",
          unchecked, unchecked == 1 ? " was" : "s were");
    }
    out += "</div>\n";
    if (ranks != nullptr && !ranks->empty()) {
      const FailureParts parts = failurePartsOf(report);
      out +=
          "<table class=\"leaks\"><tr><th>rank</th><th>checked</th><th>groups</th><th>bound</th>"
          "<th>runtime live</th><th>bytes held</th><th>workspaces held</th><th>leaked</th>"
          "<th>note</th></tr>";
      std::size_t shown = 0;
      // Leaking ranks first, within the bound.
      std::vector<const json*> order = leaking;
      for (const auto& rank : *ranks) {
        if (!leakedWhenChecked(rank)) order.push_back(&rank);
      }
      for (const json* rank : order) {
        if (shown++ >= kMaxTableRanks) break;
        std::string note = textOf(*rank, "reason");
        if (!textOf(*rank, "shutdown_error").empty())
          note += " shutdown error: " + textOf(*rank, "shutdown_error");
        out += fmt::format(
            "<tr><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td "
            "class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td "
            "class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
            integerOf(*rank, "rank").value_or(-1), flag(*rank, "checked") ? "yes" : "no",
            integerOf(*rank, "groups").value_or(0), integerOf(*rank, "bound_groups").value_or(0),
            flag(*rank, "runtime_live") ? "yes" : "no",
            esc(formatValue(numberOf(*rank, "bytes_held").value_or(0), "bytes")),
            integerOf(*rank, "workspaces_held").value_or(0),
            !checkedRank(*rank)        ? "not checked"
            : leakedWhenChecked(*rank) ? "<strong>leaked</strong>"
                                       : "no",
            failurePartTag(parts.of(integerOf(*rank, "rank").value_or(-1))) + " " +
                esc(clip(note, 400)));
      }
      out += "</table>\n";
      if (ranks->size() > kMaxTableRanks) {
        out += fmt::format("<p class=\"note\">{} of {} ranks listed (leaking ranks first).</p>\n",
                           kMaxTableRanks, ranks->size());
      }
    }
  }
  if (trends != nullptr && trends->is_object()) {
    const long long cycles = integerOf(*trends, "cycles").value_or(0);
    const long long warmup = integerOf(*trends, "warmup").value_or(0);
    const double confidence = numberOf(*trends, "confidence").value_or(0.99);
    out += "<h3 id=\"" + id + "-leak-trends\">Leak trends</h3>\n";
    out += fmt::format(
        "<p class=\"sub\">{} cycles, the first {} a warm-up (grey); a line fitted to "
        "the rest, the band between the slopes of its {:g}% confidence interval.</p>\n",
        cycles, warmup, confidence * 100);
    std::vector<const json*> series;
    if (const json* all = arrayOf(*trends, "series")) {
      for (const auto& s : *all) series.push_back(&s);
    }
    auto rankOf = [](const std::string& verdict) {
      return verdict == "leak" ? 0 : verdict == "flat" ? 2 : 1;
    };
    std::stable_sort(series.begin(), series.end(), [&](const json* a, const json* b) {
      return rankOf(textOf(*a, "verdict")) < rankOf(textOf(*b, "verdict"));
    });
    out += "<div class=\"plots\">\n";
    for (std::size_t i = 0; i < series.size() && i < kMaxTrendPlots; ++i) {
      trendPlot(out, *series[i], cycles, warmup, confidence);
    }
    out += "</div>\n";
    out +=
        "<div class=\"legend\"><span><span class=\"sw\" style=\"background:#1b1f24;"
        "border-radius:50%\"></span>measured value</span><span><span class=\"sw\" "
        "style=\"background:#9aa0a6;border-radius:50%\"></span>warm-up value (not fitted)</span>"
        "<span><span class=\"sw\" style=\"background:#D55E00;height:4px\"></span>fitted line, "
        "leak</span><span><span class=\"sw\" style=\"background:#0072B2;height:4px\"></span>"
        "fitted line, no leak</span><span><span class=\"sw\" style=\"background:#0072B22e\">"
        "</span>confidence band of the slope</span></div>\n";
    if (series.size() > kMaxTrendPlots) {
      out += fmt::format(
          "<p class=\"note\"><strong>Left out:</strong> {} of {} series drawn "
          "(leaks first).</p>\n",
          kMaxTrendPlots, series.size());
    }
  }
}

void environment(std::string& out, const json& report, const std::string& id) {
  const json& env = objectOf(child(report, "environment"));
  const json* ranks = arrayOf(report, "ranks");
  if (env.empty() && (ranks == nullptr || ranks->empty())) return;
  out += "<h3 id=\"" + id + "-environment\">Environment</h3>\n<table class=\"env\">";
  const std::pair<const char*, const char*> rows[] = {
      {"hmc_version", "hmc-run"}, {"torch_version", "LibTorch"}, {"transport", "transport"},
      {"device", "device"},       {"world_size", "world size"},  {"timeout_s", "deadline (s)"},
      {"host", "reporting host"}, {"started_at", "started at"},  {"wall_seconds", "wall time"},
      {"file", "scenario file"}};
  for (const auto& [key, title] : rows) {
    if (child(env, key) == nullptr) continue;
    std::string value = textOf(env, key);
    if (std::string_view(key) == "wall_seconds")
      value = formatSeconds(numberOf(env, key).value_or(0));
    out += fmt::format("<tr><th>{}</th><td>{}</td></tr>", title, esc(value));
  }
  if (const json* command = arrayOf(env, "command")) {
    std::string line;
    for (const auto& word : *command)
      line +=
          (line.empty() ? "" : " ") + (word.is_string() ? word.get<std::string>() : word.dump());
    out += "<tr><th>command</th><td><code>" + esc(clip(line, 2000)) + "</code></td></tr>";
  }
  out += "</table>\n";
  if (ranks == nullptr || ranks->empty()) return;
  // Hosts, each with its ranks.
  std::map<std::string, std::vector<long long>> byHost;
  std::map<std::string, std::set<long long>> pids;
  for (const auto& rank : *ranks) {
    const std::string host = textOf(rank, "host", "(unknown)");
    byHost[host].push_back(integerOf(rank, "rank").value_or(-1));
    if (const auto pid = integerOf(rank, "pid")) pids[host].insert(*pid);
  }
  out += "<table class=\"hosts\"><tr><th>host</th><th>ranks</th><th>processes</th></tr>";
  std::size_t shown = 0;
  for (const auto& [host, list] : byHost) {
    if (shown++ >= kMaxTableRanks) break;
    std::string processes;
    std::size_t listed = 0;
    for (const long long pid : pids[host]) {
      if (listed++ >= 8) {
        processes += fmt::format(", \u2026 ({} in all)", pids[host].size());
        break;
      }
      processes += fmt::format("{}{}", processes.empty() ? "" : ", ", pid);
    }
    out +=
        fmt::format("<tr><td><code>{}</code></td><td>{}</td><td class=\"mono\">{}</td></tr>",
                    esc(host), esc(rangesOf(list)), esc(processes.empty() ? "\u2013" : processes));
  }
  out += "</table>\n";
  if (byHost.size() > kMaxTableRanks) {
    out += fmt::format("<p class=\"note\">{} of {} hosts listed.</p>\n", kMaxTableRanks,
                       byHost.size());
  }
}

// The line a reader needs from each scenario: its first failure; from a report of an older hmc,
// why it could not run, its hang or a crash.
std::string firstToRead(const json& report) {
  const std::string first = firstFailureLine(report);
  if (!first.empty()) return first;
  if (const json* error = child(report, "error")) return textOf(*error, "message");
  if (const json* hang = child(report, "hang"); hang != nullptr && hang->is_object()) {
    return textOf(*hang, "diagnosis");
  }
  for (const auto& rank : objectOf(arrayOf(report, "ranks"))) {
    if (flag(rank, "crashed")) {
      return fmt::format("rank {} crashed: {}", integerOf(rank, "rank").value_or(-1),
                         textOf(rank, "crash_reason"));
    }
  }
  return "";
}

void reportSection(std::string& out, const json& report, const std::string& id, bool inSet) {
  const std::string name = textOf(report, "scenario", "(a file that did not parse)");
  const std::string outcome = outcomeOf(report);
  const HangFacts facts = hangFacts(report);
  out += "<section class=\"report\" id=\"" + id + "\" data-outcome=\"" + esc(outcome) + "\">\n";
  out += inSet ? "<h2>" : "<h1>";
  out += "Scenario <span class=\"scenario-name\">" + esc(name) + "</span>";
  badge(out, outcome);
  out += inSet ? "</h2>\n" : "</h1>\n";
  const json& env = objectOf(child(report, "environment"));
  std::string sub;
  if (const auto ws = integerOf(report, "world_size")) sub += fmt::format("{} ranks", *ws);
  if (!textOf(env, "transport").empty())
    sub += " \u00b7 " + textOf(env, "transport") + " transport";
  if (!textOf(env, "device").empty()) sub += " \u00b7 " + textOf(env, "device");
  if (const json* samples = child(report, "samples")) {
    const auto reps = integerOf(*samples, "repetitions").value_or(1);
    if (reps > 1)
      sub += fmt::format(" \u00b7 {} repetitions ({} warm-up)", reps,
                         integerOf(*samples, "warmup").value_or(0));
  }
  if (const auto wall = numberOf(env, "wall_seconds")) sub += " \u00b7 " + formatSeconds(*wall);
  if (!textOf(env, "started_at").empty()) sub += " \u00b7 " + textOf(env, "started_at");
  if (flag(report, "interrupted")) sub += " \u00b7 INTERRUPTED";
  if (!sub.empty()) out += "<p class=\"sub\">" + esc(sub) + "</p>\n";
  firstFailureBlock(out, report, id);
  summaryCallouts(out, report, facts, id);
  if (outcome != "invalid") {
    out += "<h3 id=\"" + id + "-steps\">Steps per rank</h3>\n";
    timeline(out, report, facts, id);
    if (child(report, "samples") != nullptr || child(report, "timings") != nullptr) {
      timingDistributions(out, report, id);
    }
    leaks(out, report, id);
  }
  environment(out, report, id);
  out += "</section>\n";
}

}  // namespace

std::string renderHtmlReport(const json& document) {
  const std::string format = textOf(document, "format");
  std::string out;
  if (format == "hmc-report/1") {
    const std::string name = textOf(document, "scenario", "invalid scenario");
    pageStart(out, fmt::format("hmc-run: {} \u2014 {}", name, outcomeOf(document)));
    reportSection(out, document, "r0", false);
  } else if (format == "hmc-report-set/1") {
    const json* reports = arrayOf(document, "reports");
    const std::size_t count = reports ? reports->size() : 0;
    std::string worst = "pass";
    auto severity = [](const std::string& o) {
      return o == "invalid" ? 3 : o == "hang" ? 2 : o == "fail" ? 1 : 0;
    };
    for (std::size_t i = 0; i < count; ++i) {
      const std::string o = outcomeOf((*reports)[i]);
      if (severity(o) > severity(worst)) worst = o;
    }
    pageStart(out, fmt::format("hmc-run: {} scenarios \u2014 {}", count, worst));
    out += "<h1>hmc-run: " + std::to_string(count) + " scenarios";
    badge(out, worst);
    out += "</h1>\n";
    if (flag(document, "interrupted"))
      out +=
          "<p class=\"sub\">INTERRUPTED: the run was stopped; the scenarios below are those that "
          "ran.</p>\n";
    out +=
        "<nav class=\"toc\"><table><tr><th>#</th><th>scenario</th><th>outcome</th><th>ranks</th>"
        "<th>first thing to read</th></tr>";
    for (std::size_t i = 0; i < count; ++i) {
      const json& report = (*reports)[i];
      out += fmt::format("<tr><td class=\"num\">{}</td><td>{}</td><td>", i + 1,
                         i < kMaxReportSections
                             ? fmt::format("<a href=\"#r{}\">{}</a>", i,
                                           esc(textOf(report, "scenario", "(did not parse)")))
                             : esc(textOf(report, "scenario", "(did not parse)")));
      badge(out, outcomeOf(report));
      std::string first = firstToRead(report);
      if (first.size() > 160) {
        std::size_t cut = 160;
        while (cut > 0 && (static_cast<unsigned char>(first[cut]) & 0xC0) == 0x80) --cut;
        first = first.substr(0, cut) + "\u2026";
      }
      out += fmt::format("</td><td class=\"num\">{}</td><td class=\"note\">{}</td></tr>",
                         esc(textOf(report, "world_size", "\u2013")), esc(first));
    }
    out += "</table></nav>\n";
    for (std::size_t i = 0; i < count && i < kMaxReportSections; ++i) {
      reportSection(out, (*reports)[i], fmt::format("r{}", i), true);
    }
    if (count > kMaxReportSections) {
      out += fmt::format(
          "<p class=\"note\"><strong>Left out:</strong> the sections of {} more "
          "scenarios (their outcomes are in the table above).</p>\n",
          count - kMaxReportSections);
    }
  } else {
    throw ValueError(fmt::format(
        "render: expected an hmc-report/1 or hmc-report-set/1 document, got format '{}'",
        hmc::printable(textOf(document, "format", "(none)"))));
  }
  pageEnd(out);
  return out;
}

}  // namespace hmc::render
