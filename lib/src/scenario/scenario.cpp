#include "hmc/scenario/scenario.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

#include "hmc/collective/collective.hpp"
#include "hmc/error.hpp"
#include "hmc/text.hpp"

namespace hmc::scenario {

std::chrono::milliseconds Scenario::timeout() const {
  return collective::timeoutFromSeconds(timeoutS);
}

namespace {

using nlohmann::json;
using Names = std::vector<std::string_view>;

// Limits beyond the format's own rules: they keep arithmetic and allocations sane and turn
// absurd inputs into clear messages instead of crashes at run time.
constexpr std::int64_t kMaxWorkspaceBytes = std::int64_t{64} << 30;  // 64 GiB
constexpr std::int64_t kMaxFeatures = std::int64_t{1} << 20;
constexpr std::int64_t kMaxBatch = std::int64_t{1} << 24;
constexpr std::int64_t kMaxRepeatCount = kMaxRepeat;
constexpr std::int64_t kMaxSeconds = 1'000'000;  // timeout_s
constexpr std::size_t kMaxFileBytes = std::size_t{16} << 20;  // 16 MiB
constexpr int kMaxCompatDepth = 64;
constexpr std::size_t kMaxQuotedChars = 60;
constexpr auto kPipeReadTimeout = std::chrono::seconds(10);

const Names kDtypes = {"float32", "float64", "float16", "bfloat16"};
const Names kTopLevelKeys = {"format",     "name",  "description",       "world_size",
                             "device",     "dtype", "timeout_s",         "steps",
                             "leak_trend", "reference_differs"};
// A leak fault's memory: at most this much per run of the step.
constexpr std::int64_t kMaxLeakBytes = std::int64_t{1} << 30;
const Names kReferenceDiffersKeys = {"why", "steps"};
const Names kCommonStepKeys = {"op", "ranks", "expect", "expect_error", "repeat", "label"};

// The keys of each op and of each fault kind (their names: scenario.hpp).
struct OpInfo {
  Op value;
  Names keys;  // besides the common ones (fault: besides `kind`, per kind below)
};

const std::vector<OpInfo>& opTable() {
  static const std::vector<OpInfo> table = {
      {Op::kCreate, {"module", "type", "features", "workspace_bytes", "compat", "scope"}},
      {Op::kShare, {"modules"}},
      {Op::kForward, {"module", "batch", "dtype", "device", "backward"}},
      {Op::kBackward, {"module"}},
      {Op::kDrop, {"module", "collect"}},
      {Op::kClose, {"module"}},
      {Op::kCloseAll, {}},
      {Op::kCheck, {"groups", "bound_groups", "runtime_live"}},
      {Op::kFault, {"kind"}},  // and the keys of its kind
      {Op::kBarrier, {}},
      {Op::kSleep, {"seconds"}},
      {Op::kRepeat, {"count", "steps"}},
  };
  return table;
}

struct FaultInfo {
  FaultKind value;
  Names keys;  // besides the common ones and `kind`
};

const std::vector<FaultInfo>& faultTable() {
  static const std::vector<FaultInfo> table = {
      {FaultKind::kCloseError, {"count"}},
      {FaultKind::kReleaseError, {"count"}},
      {FaultKind::kBusy, {"module", "busy"}},
      {FaultKind::kStall, {"seconds"}},
      {FaultKind::kCrash, {"planned"}},
      {FaultKind::kLeak, {"resource", "bytes"}},
  };
  return table;
}

// The entry of `value` in opTable() or faultTable(); each lists every value.
template <typename Info, typename E>
const Info& infoOf(const std::vector<Info>& table, E value) {
  return *std::find_if(table.begin(), table.end(),
                       [value](const Info& info) { return info.value == value; });
}

// The names of an enum's values, in its table's order.
template <typename E>
const Names& namesOf() {
  static const Names names = [] {
    Names out;
    for (const EnumName<E>& entry : enumTable(E{})) out.push_back(entry.name);
    return out;
  }();
  return names;
}

// ---- text helpers ----------------------------------------------------------------------

// RFC 6901: "~" -> "~0", "/" -> "~1".
std::string childPath(const std::string& path, std::string_view key) {
  std::string out = path;
  out += '/';
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string childPath(const std::string& path, std::size_t index) {
  return path + "/" + std::to_string(index);
}

// A JSON string literal, escaped, shortened when long. JSON escapes C0 controls; printable()
// also escapes DEL, C1 controls and bidi overrides, which JSON leaves raw.
std::string jsonQuoted(std::string_view text) {
  std::string shown(text.substr(0, kMaxQuotedChars));
  std::string out =
      printable(json(shown).dump(-1, ' ', false, json::error_handler_t::replace));
  if (text.size() > kMaxQuotedChars) out.insert(out.size() - 1, "...");
  return out;
}

// A key as it appears in messages: 'world_size' (escaped when it holds odd characters).
std::string keyText(std::string_view key) {
  std::string literal = jsonQuoted(key);
  return "'" + literal.substr(1, literal.size() - 2) + "'";
}

// What a value is, for "got ..." in messages.
std::string describe(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return value.dump();
    case json::value_t::string:
      return "a string " + jsonQuoted(value.get_ref<const std::string&>());
    case json::value_t::array:
      return value.empty() ? "an empty array" : "an array";
    case json::value_t::object:
      return value.empty() ? "an empty object" : "an object";
    case json::value_t::binary:
      return "binary data";
    case json::value_t::discarded:
      return "nothing";
  }
  return "an unknown value";
}

std::string join(const Names& names, std::string_view separator = ", ", bool quoteEach = false) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += separator;
    out += quoteEach ? jsonQuoted(names[i]) : std::string(names[i]);
  }
  return out;
}

// Optimal string alignment distance, case-insensitive: a swap of two neighbours is one edit.
std::size_t editDistance(std::string_view a, std::string_view b) {
  auto same = [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  };
  const std::size_t width = b.size() + 1;
  std::vector<std::size_t> d((a.size() + 1) * width);
  for (std::size_t i = 0; i <= a.size(); ++i) d[i * width] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t best =
          std::min({d[(i - 1) * width + j] + 1, d[i * width + j - 1] + 1,
                    d[(i - 1) * width + j - 1] + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1])) {
        best = std::min(best, d[(i - 2) * width + j - 2] + 1);
      }
      d[i * width + j] = best;
    }
  }
  return d[a.size() * width + b.size()];
}

// The candidate a word is most likely a typo of: at most two edits, and fewer edits than a
// third of the word (so "id" does not become "op").
std::optional<std::string_view> closest(std::string_view word, const Names& candidates) {
  if (word.size() > 64) return std::nullopt;
  const std::size_t limit = std::min<std::size_t>(2, std::max<std::size_t>(1, word.size() / 3));
  std::optional<std::string_view> best;
  std::size_t bestDistance = limit + 1;
  for (std::string_view candidate : candidates) {
    const std::size_t distance = editDistance(word, candidate);
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best;
}

std::string errnoText(int error) { return std::generic_category().message(error); }

// ---- the parser --------------------------------------------------------------------------

class Parser {
 public:
  Parser(std::string file, const ParseOptions& options) : file_(std::move(file)) {
    if (options.worldSize) {
      if (*options.worldSize < 1 || *options.worldSize > kMaxWorldSize) {
        fail("", fmt::format("the world_size override (--world-size) must be in 1..{}, got {}",
                             kMaxWorldSize, *options.worldSize));
      }
      worldSizeOverride_ = options.worldSize;
    }
  }

  Scenario parse(const json& document) {
    if (!document.is_object()) {
      fail("", "expected a JSON object at the top level, got " + describe(document));
    }
    // A wrong format comes first: the rest of such a file follows other rules.
    const json* format = find(document, "format");
    if (format != nullptr &&
        (!format->is_string() || format->get_ref<const std::string&>() != kScenarioFormat)) {
      fail("/format",
           fmt::format("expected {}, got {}", jsonQuoted(kScenarioFormat), describe(*format)));
    }
    checkKeys(document, "", kTopLevelKeys, "");
    required(document, "", "format");

    Scenario scenario;
    scenario.file = file_;
    scenario.name = readString(required(document, "", "name"), "/name", true);
    if (const json* value = find(document, "description")) {
      scenario.description = readString(*value, "/description", false);
    }
    if (const json* value = find(document, "world_size")) {
      scenario.worldSize = static_cast<int>(readInt(*value, "/world_size", 1, kMaxWorldSize));
    }
    if (worldSizeOverride_) scenario.worldSize = *worldSizeOverride_;
    worldSize_ = scenario.worldSize;
    if (const json* value = find(document, "device")) {
      scenario.device = readDevice(*value, "/device");
    }
    if (const json* value = find(document, "dtype")) {
      scenario.dtype = readDtype(*value, "/dtype");
    }
    if (const json* value = find(document, "timeout_s")) {
      scenario.timeoutS = readSeconds(*value, "/timeout_s", true, kMaxSeconds);
    }
    const json& steps = required(document, "", "steps");
    Cost cost;
    scenario.steps = readSteps(steps, "/steps", 0, false, cost);
    if (const json* value = find(document, "reference_differs")) {
      scenario.referenceDiffers = readReferenceDiffers(*value, scenario.steps.size());
    }
    if (const json* value = find(document, "leak_trend")) {
      scenario.leakTrend = readEnum<LeakTrendExpect>(*value, "/leak_trend");
    }
    return scenario;
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ScenarioError(file_, path, what);
  }

  static const json* find(const json& object, std::string_view key) {
    auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
  }

  const json& required(const json& object, const std::string& path, std::string_view key,
                       std::string_view hint = "") const {
    if (const json* value = find(object, key)) return *value;
    fail(path, fmt::format("missing required key {}{}", keyText(key), hint));
  }

  // Rejects keys outside `allowed`; `context` (" for op 'forward'") goes after the key.
  void checkKeys(const json& object, const std::string& path, const Names& allowed,
                 std::string_view context,
                 const std::function<std::string(std::string_view)>& owner = {}) const {
    for (const auto& item : object.items()) {
      const std::string& key = item.key();
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string message =
          fmt::format("unknown key {}{}; expected one of {}", keyText(key), context, join(allowed));
      const std::string belongs = owner ? owner(key) : std::string();
      if (!belongs.empty()) {
        message += "; " + keyText(key) + " belongs to " + belongs;
      } else if (auto guess = closest(key, allowed)) {
        message += fmt::format("; did you mean {}?", keyText(*guess));
      }
      fail(childPath(path, key), message);
    }
  }

  std::string readString(const json& value, const std::string& path, bool nonEmpty) const {
    if (!value.is_string()) fail(path, "expected a string, got " + describe(value));
    const auto& text = value.get_ref<const std::string&>();
    if (nonEmpty && text.empty()) fail(path, "expected a non-empty string, got an empty string");
    return text;
  }

  bool readBool(const json& value, const std::string& path) const {
    if (!value.is_boolean()) fail(path, "expected true or false, got " + describe(value));
    return value.get<bool>();
  }

  std::int64_t readInt(const json& value, const std::string& path, std::int64_t min,
                       std::int64_t max) const {
    if (!value.is_number_integer()) fail(path, "expected an integer, got " + describe(value));
    if (!intFits(value, min, max)) {
      const std::string range = max == std::numeric_limits<std::int64_t>::max()
                                    ? fmt::format(">= {}", min)
                                    : fmt::format("in {}..{}", min, max);
      fail(path, fmt::format("expected an integer {}, got {}", range, describe(value)));
    }
    return value.get<std::int64_t>();
  }

  // Whether an integer value lies in [min, max] (min >= 0 or not; unsigned values may exceed
  // the int64 range).
  static bool intFits(const json& value, std::int64_t min, std::int64_t max) {
    if (value.is_number_unsigned()) {
      const auto number = value.get<std::uint64_t>();
      return (min <= 0 || number >= static_cast<std::uint64_t>(min)) && max >= 0 &&
             number <= static_cast<std::uint64_t>(max);
    }
    const auto number = value.get<std::int64_t>();
    return number >= min && number <= max;
  }

  // A duration in seconds: > 0 when `positive`, else >= 0; at most `max`.
  double readSeconds(const json& value, const std::string& path, bool positive,
                     std::int64_t max) const {
    if (!value.is_number()) fail(path, "expected a number, got " + describe(value));
    const double seconds = value.get<double>();
    const bool low = positive ? !(seconds > 0) : !(seconds >= 0);
    if (low || !std::isfinite(seconds) || seconds > static_cast<double>(max)) {
      fail(path, fmt::format("expected a number of seconds {} 0 and <= {}, got {}",
                             positive ? ">" : ">=", max, describe(value)));
    }
    return seconds;
  }

  // One of `names`; returns its index.
  std::size_t readChoice(const json& value, const std::string& path, const Names& names) const {
    if (value.is_string()) {
      const auto& text = value.get_ref<const std::string&>();
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (names[i] == text) return i;
      }
    }
    std::string message =
        fmt::format("expected one of {}, got {}", join(names, ", ", true), describe(value));
    if (value.is_string()) {
      if (auto guess = closest(value.get_ref<const std::string&>(), names)) {
        message += fmt::format("; did you mean {}?", jsonQuoted(*guess));
      }
    }
    fail(path, message);
  }

  // One of an enum's names (its table, with the parser's message and suggestion).
  template <typename E>
  E readEnum(const json& value, const std::string& path) const {
    return enumTable(E{})[readChoice(value, path, namesOf<E>())].value;
  }

  Device readDevice(const json& value, const std::string& path) const {
    return readEnum<Device>(value, path);
  }

  std::string readDtype(const json& value, const std::string& path) const {
    return std::string(kDtypes[readChoice(value, path, kDtypes)]);
  }

  // A module name that an earlier step (in document order) creates.
  std::string readModuleRef(const json& value, const std::string& path) const {
    std::string name = readString(value, path, true);
    if (created_.count(name) == 0) {
      fail(path, fmt::format("module {} is never created before this step", keyText(name)));
    }
    return name;
  }

  // What running some steps costs one rank: steps executed and seconds slept or stalled,
  // repeats multiplied out. Exact: every part is checked against its limit as soon as it
  // is known, so no product exceeds kMaxRepeat^2 * kMaxStepsPerRank (< 2^64).
  struct Cost {
    std::uint64_t steps = 0;
    double seconds = 0;
  };

  // Refuses a cost over the limits; `what` says whose cost it is ("this repeat runs", ...).
  void checkCost(const Cost& cost, const std::string& path, const std::string& what) const {
    if (cost.steps > static_cast<std::uint64_t>(kMaxStepsPerRank)) {
      fail(path, fmt::format("{} {} steps on each rank, over the limit of {} steps per rank "
                             "(nested repeats multiply); lower 'count' or 'repeat', or split "
                             "the work into several scenarios",
                             what, cost.steps, kMaxStepsPerRank));
    }
    if (cost.seconds > kMaxSleepSecondsPerRank) {
      fail(path, fmt::format("{} {} seconds of sleep and stall on each rank, over the limit of "
                             "{} s (one day) per rank; lower 'seconds', 'count' or 'repeat'",
                             what, cost.seconds, kMaxSleepSecondsPerRank));
    }
  }

  std::vector<Step> readSteps(const json& value, const std::string& path, int depth,
                              bool nonEmpty, Cost& total) {
    if (!value.is_array()) fail(path, "expected an array of steps, got " + describe(value));
    if (nonEmpty && value.empty()) fail(path, "expected a non-empty array of steps");
    std::vector<Step> steps;
    steps.reserve(value.size());
    total = Cost{};
    for (std::size_t i = 0; i < value.size(); ++i) {
      const std::string at = childPath(path, i);
      Cost cost;
      steps.push_back(readStep(value[i], at, depth, cost));
      total.steps += cost.steps;
      total.seconds += cost.seconds;
      checkCost(total, at, i == 0 ? "this step runs" : "the steps up to this one run");
    }
    return steps;
  }

  std::vector<int> readRanks(const json& value, const std::string& path) const {
    if (!value.is_array()) fail(path, "expected an array of ranks, got " + describe(value));
    // An empty list is valid: no rank runs the step (the reference runner skips it on all).
    std::vector<int> ranks;
    for (std::size_t i = 0; i < value.size(); ++i) {
      const std::string at = childPath(path, i);
      const json& element = value[i];
      if (!element.is_number_integer()) fail(at, "expected an integer, got " + describe(element));
      const bool inRange = !element.is_number_unsigned() ||
                           element.get<std::uint64_t>() < static_cast<std::uint64_t>(worldSize_);
      const std::int64_t rank = element.get<std::int64_t>();
      if (!inRange || rank < 0 || rank >= worldSize_) {
        fail(at,
             fmt::format("rank {} is out of range for world_size {}{}; ranks are 0..{}",
                         describe(element), worldSize_,
                         worldSizeOverride_ ? " (the --world-size override)" : "", worldSize_ - 1));
      }
      if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) {
        fail(at, fmt::format("rank {} is listed more than once", rank));
      }
      ranks.push_back(static_cast<int>(rank));
    }
    return ranks;
  }

  // hmc's extension: {"why": non-empty string, "steps": [distinct top-level step indices]}.
  ReferenceDiffers readReferenceDiffers(const json& value, std::size_t stepCount) const {
    const std::string path = "/reference_differs";
    if (!value.is_object()) {
      fail(path, "expected an object {\"why\": ..., \"steps\": [...]}, got " + describe(value));
    }
    checkKeys(value, path, kReferenceDiffersKeys, " in reference_differs");
    ReferenceDiffers out;
    out.why = readString(required(value, path, "why", " (why the reference runner differs)"),
                         childPath(path, "why"), true);
    if (const json* steps = find(value, "steps")) {
      const std::string at = childPath(path, "steps");
      if (!steps->is_array()) {
        fail(at, "expected an array of top-level step indices, got " + describe(*steps));
      }
      for (std::size_t i = 0; i < steps->size(); ++i) {
        const json& element = (*steps)[i];
        const std::string elementPath = childPath(at, i);
        if (!element.is_number_integer()) {
          fail(elementPath, "expected an integer, got " + describe(element));
        }
        if (stepCount == 0 || !intFits(element, 0, static_cast<std::int64_t>(stepCount) - 1)) {
          fail(elementPath, stepCount == 0
                                ? fmt::format("step {} does not exist: the scenario has no steps",
                                              describe(element))
                                : fmt::format("step {} does not exist: top-level steps are 0..{}",
                                              describe(element), stepCount - 1));
        }
        const int index = static_cast<int>(element.get<std::int64_t>());
        if (std::find(out.steps.begin(), out.steps.end(), index) != out.steps.end()) {
          fail(elementPath, fmt::format("step {} is listed more than once", index));
        }
        out.steps.push_back(index);
      }
      std::sort(out.steps.begin(), out.steps.end());
    }
    return out;
  }

  // `compat` is any JSON, but copying it recurses: bound its nesting.
  void checkCompatDepth(const json& value, const std::string& path) const {
    std::vector<std::pair<const json*, int>> stack = {{&value, 1}};
    while (!stack.empty()) {
      auto [node, depth] = stack.back();
      stack.pop_back();
      if (!node->is_structured()) continue;
      if (depth > kMaxCompatDepth) {
        fail(path, fmt::format("compat nests deeper than {} levels", kMaxCompatDepth));
      }
      for (const json& child : *node) stack.emplace_back(&child, depth + 1);
    }
  }

  // Which ops (or fault kinds) own a key that `op` does not take: "op create", "...".
  static std::string ownerOf(std::string_view key, std::string_view exceptOp) {
    Names owners;
    for (const OpInfo& info : opTable()) {
      if (toString(info.value) == exceptOp) continue;
      if (std::find(info.keys.begin(), info.keys.end(), key) != info.keys.end()) {
        owners.push_back(toString(info.value));
      }
    }
    std::string out;
    if (!owners.empty()) out = (owners.size() == 1 ? "op " : "ops ") + join(owners);
    Names kinds;
    for (const FaultInfo& info : faultTable()) {
      if (std::find(info.keys.begin(), info.keys.end(), key) != info.keys.end()) {
        kinds.push_back(toString(info.value));
      }
    }
    if (!kinds.empty()) {
      if (!out.empty()) out += " and ";
      out += "fault kind" + std::string(kinds.size() == 1 ? " " : "s ") + join(kinds);
    }
    return out;
  }

  void readForward(const json& value, const std::string& path, Step& step) {
    step.module = readModuleRef(required(value, path, "module"), childPath(path, "module"));
    if (const json* v = find(value, "batch")) {
      step.batch = readInt(*v, childPath(path, "batch"), 0, kMaxBatch);
    }
    if (const json* v = find(value, "dtype")) step.dtype = readDtype(*v, childPath(path, "dtype"));
    if (const json* v = find(value, "device")) {
      step.device = readDevice(*v, childPath(path, "device"));
    }
    if (const json* v = find(value, "backward")) {
      step.backward = readBool(*v, childPath(path, "backward"));
    }
  }

  // A check naming none of its keys checks nothing, as in the reference runner.
  void readCheck(const json& value, const std::string& path, Step& step) {
    if (const json* v = find(value, "groups")) {
      step.groups =
          readInt(*v, childPath(path, "groups"), 0, std::numeric_limits<std::int64_t>::max());
    }
    if (const json* v = find(value, "bound_groups")) {
      step.boundGroups = readInt(*v, childPath(path, "bound_groups"), 0,
                                 std::numeric_limits<std::int64_t>::max());
    }
    if (const json* v = find(value, "runtime_live")) {
      step.runtimeLive = readBool(*v, childPath(path, "runtime_live"));
    }
  }

  Step readStep(const json& value, const std::string& path, int depth, Cost& cost) {
    if (!value.is_object()) fail(path, "expected a step object, got " + describe(value));
    Step step;
    step.path = path;

    const json& opValue = required(value, path, "op", " (" + join(namesOf<Op>()) + ")");
    const OpInfo& op = infoOf(opTable(), readEnum<Op>(opValue, childPath(path, "op")));
    step.op = op.value;

    Names allowed = kCommonStepKeys;
    std::string context = fmt::format(" for op {}", keyText(toString(op.value)));
    if (op.value == Op::kFault) {
      const json& kindValue =
          required(value, path, "kind", " (" + join(namesOf<FaultKind>()) + ")");
      const FaultInfo& kind =
          infoOf(faultTable(), readEnum<FaultKind>(kindValue, childPath(path, "kind")));
      step.faultKind = kind.value;
      allowed.push_back("kind");
      allowed.insert(allowed.end(), kind.keys.begin(), kind.keys.end());
      context = fmt::format(" for fault kind {}", keyText(toString(kind.value)));
      checkKeys(value, path, allowed, context,
                [&](std::string_view key) { return ownerOf(key, "fault"); });
    } else {
      allowed.insert(allowed.end(), op.keys.begin(), op.keys.end());
      checkKeys(value, path, allowed, context,
                [&](std::string_view key) { return ownerOf(key, toString(op.value)); });
    }

    readCommon(value, path, step);
    switch (op.value) {
      case Op::kCreate:
        readCreate(value, path, step);
        break;
      case Op::kShare: {
        const std::string at = childPath(path, "modules");
        const json& modules = required(value, path, "modules");
        if (!modules.is_array()) {
          fail(at, "expected an array of module names, got " + describe(modules));
        }
        // An empty list is valid input: sharing it raises the reference's ValueError at run time.
        for (std::size_t i = 0; i < modules.size(); ++i) {
          step.modules.push_back(readModuleRef(modules[i], childPath(at, i)));
        }
        break;
      }
      case Op::kForward:
        readForward(value, path, step);
        break;
      case Op::kDrop:
        if (const json* v = find(value, "collect")) {
          step.collect = readBool(*v, childPath(path, "collect"));
        }
        [[fallthrough]];
      case Op::kBackward:
      case Op::kClose:
        step.module = readModuleRef(required(value, path, "module"), childPath(path, "module"));
        break;
      case Op::kCloseAll:
      case Op::kBarrier:
        break;
      case Op::kCheck:
        readCheck(value, path, step);
        break;
      case Op::kFault:
        readFault(value, path, step);
        break;
      case Op::kSleep:
        if (const json* v = find(value, "seconds")) {
          step.seconds = readSeconds(*v, childPath(path, "seconds"), false, kMaxStepSeconds);
        }
        break;
      case Op::kRepeat: {
        if (depth >= kMaxRepeatDepth) {
          fail(path, fmt::format("repeat steps nest deeper than {} levels", kMaxRepeatDepth));
        }
        step.count = static_cast<int>(
            readInt(required(value, path, "count"), childPath(path, "count"), 0, kMaxRepeatCount));
        Cost nested;
        step.steps = readSteps(required(value, path, "steps"), childPath(path, "steps"),
                               depth + 1, false, nested);
        // An iteration with no nested steps still counts as one, as does a count of 0.
        const auto count = static_cast<std::uint64_t>(step.count);
        const auto repeat = static_cast<std::uint64_t>(step.repeat);
        cost.steps = std::max<std::uint64_t>(1, count * std::max<std::uint64_t>(1, nested.steps));
        cost.seconds = static_cast<double>(count) * nested.seconds;
        checkCost(cost, path, fmt::format("this repeat (count {} x {} nested steps) runs",
                                          step.count, nested.steps));
        cost.steps *= repeat;
        cost.seconds *= static_cast<double>(repeat);
        if (repeat > 1) {
          checkCost(cost, path,
                    fmt::format("this repeat (count {} x {} nested steps, repeated {} times) runs",
                                step.count, nested.steps, step.repeat));
        }
        return step;
      }
    }
    cost.steps = static_cast<std::uint64_t>(step.repeat);
    const bool sleeps =
        step.op == Op::kSleep || (step.op == Op::kFault && step.faultKind == FaultKind::kStall);
    cost.seconds = sleeps ? step.seconds * step.repeat : 0;
    if (sleeps) {
      checkCost(cost, path, fmt::format("this step ({} s, repeated {} times) runs", step.seconds,
                                        step.repeat));
    }
    return step;
  }

  void readCommon(const json& value, const std::string& path, Step& step) const {
    if (const json* v = find(value, "ranks")) step.ranks = readRanks(*v, childPath(path, "ranks"));
    std::optional<Expect> expect;
    if (const json* v = find(value, "expect")) {
      expect = readEnum<Expect>(*v, childPath(path, "expect"));
    }
    if (const json* v = find(value, "expect_error")) {
      step.expectError = readString(*v, childPath(path, "expect_error"), false);
      if (expect && *expect != Expect::kError && *expect != Expect::kAny) {
        fail(childPath(path, "expect_error"),
             fmt::format("expect_error needs expect \"error\" or \"any\", but expect is \"{}\"",
                         toString(*expect)));
      }
    }
    step.expect = expect ? *expect : (step.expectError ? Expect::kError : Expect::kOk);
    if (const json* v = find(value, "repeat")) {
      step.repeat = static_cast<int>(readInt(*v, childPath(path, "repeat"), 1, kMaxRepeatCount));
    }
    if (const json* v = find(value, "label")) {
      step.label = readString(*v, childPath(path, "label"), false);
    }
  }

  void readCreate(const json& value, const std::string& path, Step& step) {
    const std::string modulePath = childPath(path, "module");
    step.module = readString(required(value, path, "module"), modulePath, true);
    if (const json* v = find(value, "type")) {
      static const Names types = {"scratch_linear", "scratch_mlp"};
      step.type = std::string(types[readChoice(*v, childPath(path, "type"), types)]);
    }
    if (const json* v = find(value, "features")) {
      step.features = readInt(*v, childPath(path, "features"), 1, kMaxFeatures);
    }
    if (const json* v = find(value, "workspace_bytes")) {
      const std::string at = childPath(path, "workspace_bytes");
      if (v->is_number_integer() &&
          !intFits(*v, std::numeric_limits<std::int64_t>::min(), kMaxWorkspaceBytes)) {
        fail(at, fmt::format("workspace_bytes {} is over the limit of 64 GiB ({} bytes)",
                             describe(*v), kMaxWorkspaceBytes));
      }
      step.workspaceBytes = readInt(*v, at, 0, std::numeric_limits<std::int64_t>::max());
    } else if (step.features * step.features * 4 > kMaxWorkspaceBytes) {
      fail(childPath(path, "features"),
           fmt::format("features {} gives a default workspace_bytes of {} (features * features "
                       "* 4), over the limit of 64 GiB ({} bytes); set workspace_bytes",
                       step.features, step.features * step.features * 4, kMaxWorkspaceBytes));
    }
    if (const json* v = find(value, "compat"); v != nullptr && !v->is_null()) {
      checkCompatDepth(*v, childPath(path, "compat"));
      step.compat = *v;
    }
    if (const json* v = find(value, "scope")) {
      step.scope = readString(*v, childPath(path, "scope"), false);
    }
    created_.insert(step.module);
  }

  void readFault(const json& value, const std::string& path, Step& step) const {
    switch (step.faultKind) {
      case FaultKind::kCloseError:
      case FaultKind::kReleaseError:
        if (const json* v = find(value, "count")) {
          step.faultCount =
              static_cast<int>(readInt(*v, childPath(path, "count"), 1, kMaxRepeatCount));
        }
        break;
      case FaultKind::kBusy:
        step.module = readModuleRef(required(value, path, "module"), childPath(path, "module"));
        if (const json* v = find(value, "busy")) step.busy = readBool(*v, childPath(path, "busy"));
        break;
      case FaultKind::kStall:
        step.seconds = 1;
        if (const json* v = find(value, "seconds")) {
          step.seconds = readSeconds(*v, childPath(path, "seconds"), false, kMaxStepSeconds);
        }
        break;
      case FaultKind::kCrash:
        if (const json* v = find(value, "planned")) {
          step.crashPlanned = readBool(*v, childPath(path, "planned"));
        }
        break;
      case FaultKind::kLeak:
        if (const json* v = find(value, "resource")) {
          step.leakResource = readEnum<LeakResource>(*v, childPath(path, "resource"));
        }
        if (const json* v = find(value, "bytes")) {
          const std::string at = childPath(path, "bytes");
          if (step.leakResource != LeakResource::kMemory &&
              step.leakResource != LeakResource::kMapped) {
            fail(at, fmt::format("bytes is for a leak of memory, not of a {}",
                                 toString(step.leakResource)));
          }
          step.leakBytes = readInt(*v, at, 1, kMaxLeakBytes);
        }
        break;
    }
  }

  std::string file_;
  std::optional<int> worldSizeOverride_;
  int worldSize_ = 1;
  std::set<std::string> created_;
};

// ---- reading files -----------------------------------------------------------------------

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

// `size`: "20971520 bytes, " where known.
std::string tooLarge(const std::string& size) {
  return fmt::format("file is {}over the limit of 16 MiB ({} bytes) for scenario files", size,
                     kMaxFileBytes);
}

// Reads at most kMaxFileBytes. Non-blocking, so that a FIFO without a writer or a device
// without data cannot hang the caller.
std::string readFile(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) throw ScenarioError(path, "", "cannot read: " + errnoText(errno));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    throw ScenarioError(path, "", "cannot read: " + errnoText(errno));
  }
  if (S_ISDIR(info.st_mode)) throw ScenarioError(path, "", "cannot read: " + errnoText(EISDIR));
  if (S_ISREG(info.st_mode) && static_cast<std::uint64_t>(info.st_size) > kMaxFileBytes) {
    throw ScenarioError(path, "", tooLarge(fmt::format("{} bytes, ", info.st_size)));
  }

  std::string text;
  char buffer[1 << 16];
  const auto deadline = std::chrono::steady_clock::now() + kPipeReadTimeout;
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
      if (text.size() > kMaxFileBytes) {
        throw ScenarioError(path, "", tooLarge(""));
      }
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd waiter{fd.get(), POLLIN, 0};
      if (left.count() <= 0 || ::poll(&waiter, 1, static_cast<int>(left.count())) == 0) {
        throw ScenarioError(path, "", "cannot read: no data arrived within 10 s");
      }
      continue;
    }
    throw ScenarioError(path, "", "cannot read: " + errnoText(errno));
  }
  return text;
}

// The offset of the first byte that is not valid UTF-8, or npos.
std::size_t invalidUtf8At(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    std::uint32_t code = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
      code = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      code = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      code = c & 0x07;
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return i;
      code = (code << 6) | (next & 0x3F);
    }
    const bool overlong = (length == 3 && code < 0x800) || (length == 4 && code < 0x10000);
    if (overlong || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return i;
    i += length;
  }
  return std::string_view::npos;
}

// "line 3, column 5" of a byte offset (both 1-based, columns count bytes).
std::string lineColumn(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  const std::size_t line =
      1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
  const std::size_t lineStart = before.rfind('\n');
  const std::size_t column = lineStart == std::string_view::npos ? offset + 1 : offset - lineStart;
  return fmt::format("line {}, column {}", line, column);
}

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line 1,
// column 2: " prefix.
std::string parseReason(const std::string& what) {
  std::size_t start = what.find("] ");
  start = start == std::string::npos ? 0 : start + 2;
  const std::size_t column = what.find("column ", start);
  if (column != std::string::npos) {
    const std::size_t colon = what.find(": ", column);
    if (colon != std::string::npos) return what.substr(colon + 2);
  }
  const std::size_t colon = what.find(": ", start);
  return colon == std::string::npos ? what.substr(start) : what.substr(colon + 2);
}

}  // namespace

bool isScenarioDtype(std::string_view dtype) noexcept {
  return std::find(kDtypes.begin(), kDtypes.end(), dtype) != kDtypes.end();
}

Scenario parseScenario(const json& document, const std::string& file, const ParseOptions& options) {
  return Parser(file, options).parse(document);
}

std::string readScenarioFile(const std::string& path) { return readFile(path); }

Scenario loadScenario(const std::string& path, const ParseOptions& options) {
  return parseScenarioText(readFile(path), path, options);
}

Scenario parseScenarioText(std::string_view text, const std::string& path,
                           const ParseOptions& options) {
  if (text.size() > kMaxFileBytes) {
    throw ScenarioError(path, "", tooLarge(fmt::format("{} bytes, ", text.size())));
  }
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw ScenarioError(
        path, "",
        fmt::format("file is empty; expected a JSON object in the {} format", kScenarioFormat));
  }
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    throw ScenarioError(path, "", fmt::format("not a text file (a NUL byte at offset {})", nul));
  }
  if (const std::size_t bad = invalidUtf8At(text); bad != std::string_view::npos) {
    throw ScenarioError(path, "", fmt::format("not a text file (invalid UTF-8 at offset {})", bad));
  }
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& error) {
    const std::size_t offset = error.byte > 0 ? error.byte - 1 : 0;
    throw ScenarioError(path, "",
                        fmt::format("invalid JSON at {} (offset {}): {}", lineColumn(text, offset),
                                    offset, printable(parseReason(error.what()))));
  } catch (const json::exception& error) {
    throw ScenarioError(path, "", "invalid JSON: " + printable(parseReason(error.what())));
  }
  return parseScenario(document, path, options);
}

}  // namespace hmc::scenario
