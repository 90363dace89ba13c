#include "hmc/diagnostics/diagnosis.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include "hmc/text.hpp"

namespace hmc::diagnostics {
namespace {

using json = nlohmann::json;

constexpr std::size_t kValueChars = 160;  // a manifest entry as a line quotes it

// "rank 3" or "ranks [0, 2]".
std::string ranksText(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks.front());
  return fmt::format("ranks [{}]", fmt::join(ranks, ", "));
}

std::string quoted(const json& value) {
  // A specification kept as JSON text reads as the JSON it holds.
  std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  if (text.size() > kValueChars) text = text.substr(0, kValueChars) + "...";
  return text;
}

bool waitKind(const std::string& kind) { return kind == "timeout" || kind == "rank_failure"; }

// When a rank's failure happened, in the world's order of collectives (see the header).
std::tuple<std::uint64_t, int, int, int> orderOf(const FailureView& view) {
  constexpr auto kLast = std::numeric_limits<std::uint64_t>::max();
  int priority = 3;
  if (view.kind == kManifestMismatch || view.kind == kCollectiveMismatch) priority = 0;
  if (waitKind(view.kind)) priority = 1;
  if (view.kind == kError) priority = 2;
  // Known from outside, in this order: a crash (the process ended by itself), then a rank
  // that left no end, then a stop (a signal: often the launcher's teardown after that crash).
  if (view.kind == kCrash) return {kLast, 2, priority, view.rank};
  if (view.kind == kStoreLost) return {kLast, 2, priority + 1, view.rank};
  if (view.kind == kMissing) return {kLast, 3, priority, view.rank};
  if (view.kind == kStopped) return {kLast, 4, priority, view.rank};
  if (view.kind == kLeak) return {kLast, 5, priority, view.rank};
  if (view.sequence) return {*view.sequence, 1, priority, view.rank};
  return {view.collectivesBefore, 0, priority, view.rank};
}

}  // namespace

// "'close validation' #26 (step 4)": where a view's failure happened; `orOp`: for a failure
// no collective raised, the call ("forward"), else nothing.
std::string whereText(const FailureView& view, bool orOp) {
  std::string where = view.sequence        ? fmt::format("'{}' #{}", view.stage, *view.sequence)
                      : !view.stage.empty() ? fmt::format("'{}'", view.stage)
                      : orOp                ? view.op
                                            : std::string();
  if (view.step) where += fmt::format(" (step {})", *view.step);
  return where;
}

std::string failureKindWords(std::string_view kind) {
  if (kind == "rank_failure") return "lost a rank";
  if (kind == kStoreLost) return "lost the store";
  std::string words(kind);
  std::replace(words.begin(), words.end(), '_', ' ');
  return words;
}

std::string describeFailure(const FailureView& view) {
  const std::string where = whereText(view, false);
  return fmt::format("{}{}: {}", failureKindWords(view.kind), where.empty() ? "" : " in " + where,
                     printable(view.message));
}

namespace {

class Builder {
 public:
  Builder(const std::vector<FailureView>& views, int worldSize,
          const std::vector<std::string>& hosts, const std::map<int, std::string>& whereabouts)
      : views_(views), worldSize_(worldSize), hosts_(hosts), whereabouts_(whereabouts) {
    for (const FailureView& view : views_) byRank_[view.rank] = &view;
    std::set<std::string> distinct;
    for (const auto& host : hosts_)
      if (!host.empty()) distinct.insert(host);
    for (const FailureView& view : views_)
      if (!view.host.empty()) distinct.insert(view.host);
    manyHosts_ = distinct.size() > 1;
  }

  Diagnosis build() {
    Diagnosis diagnosis;
    if (views_.empty()) return diagnosis;
    const FailureView& first =
        *std::min_element(views_.begin(), views_.end(), [](const auto& a, const auto& b) {
          return orderOf(a) < orderOf(b);
        });
    FirstFailure failure;
    failure.stage = first.stage;
    failure.sequence = first.sequence;
    failure.step = first.step;
    if (first.kind == kManifestMismatch) {
      manifestMismatch(first, failure);
    } else if (first.kind == kCollectiveMismatch) {
      collectiveMismatch(first, failure);
    } else if (waitKind(first.kind)) {
      hang(first, failure);
    } else {
      other(first, failure);
    }
    for (const int rank : failure.ranks) {
      const std::string host = hostOf(rank);
      if (!host.empty() &&
          std::find(failure.hosts.begin(), failure.hosts.end(), host) == failure.hosts.end()) {
        failure.hosts.push_back(host);
      }
    }
    const std::set<int> part(failure.seenBy.begin(), failure.seenBy.end());
    const std::set<int> named(failure.ranks.begin(), failure.ranks.end());
    for (const FailureView& view : views_) {
      // A named rank's own record is part of the failure when it is what the others saw of it
      // (its crash); a failure of its own later on follows, as the others' do.
      const bool itself = named.count(view.rank) != 0 &&
                          (view.kind == kCrash || view.kind == kStopped || view.kind == kMissing ||
                           view.kind == failure.kind);
      if (part.count(view.rank) != 0 || itself) continue;
      diagnosis.consequences.push_back(
          {view.rank, fmt::format("rank {}{}: {} (follows from the first failure)", view.rank,
                                  hostSuffix(view.rank), describeFailure(view))});
    }
    std::sort(diagnosis.consequences.begin(), diagnosis.consequences.end(),
              [](const auto& a, const auto& b) { return a.rank < b.rank; });
    diagnosis.first = std::move(failure);
    return diagnosis;
  }

 private:
  std::string hostOf(int rank) const {
    if (auto it = byRank_.find(rank); it != byRank_.end() && !it->second->host.empty()) {
      return it->second->host;
    }
    if (rank >= 0 && rank < static_cast<int>(hosts_.size())) return hosts_[rank];
    return "";
  }
  // " (host h2)" where the world spans hosts.
  std::string hostSuffix(int rank) const {
    const std::string host = hostOf(rank);
    return manyHosts_ && !host.empty() ? fmt::format(" (host {})", printable(host)) : "";
  }
  std::string ranksWithHosts(const std::vector<int>& ranks) const {
    if (!manyHosts_) return ranksText(ranks);
    std::vector<std::string> parts;
    for (const int rank : ranks) parts.push_back(fmt::format("{}{}", rank, hostSuffix(rank)));
    return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks",
                       ranks.size() == 1 ? parts.front()
                                         : fmt::format("[{}]", fmt::join(parts, ", ")));
  }
  // The views of `kind` at `sequence` (any sequence when nullopt).
  std::vector<int> ranksWith(const std::string& kind, std::optional<std::uint64_t> sequence,
                             const std::string& stage) const {
    std::vector<int> ranks;
    for (const FailureView& view : views_) {
      const bool sameKind = kind == "wait" ? waitKind(view.kind) : view.kind == kind;
      if (sameKind && (!sequence || view.sequence == sequence) &&
          (stage.empty() || view.stage == stage)) {
        ranks.push_back(view.rank);
      }
    }
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  }

  void manifestMismatch(const FailureView& first, FirstFailure& failure) const {
    failure.kind = std::string(kManifestMismatch);
    failure.seenBy = ranksWith(first.kind, first.sequence, "");
    const json& ranks = first.mismatch.is_object() ? first.mismatch.value("ranks", json::array())
                                                   : json::array();
    // The ranks grouped by what they hold; the largest group is taken as right (a tie: rank 0's).
    std::map<std::string, std::vector<int>> groups;
    std::map<int, const json*> held;
    for (const json& entry : ranks) {
      const int rank = entry.at("rank").get<int>();
      json key = {entry.value("manifest", json()), entry.value("signature", json())};
      groups[key.dump()].push_back(rank);
      held[rank] = &entry;
    }
    const std::vector<int>* majority = nullptr;
    for (const auto& [key, members] : groups) {
      const bool hasZero = std::find(members.begin(), members.end(), 0) != members.end();
      if (majority == nullptr || members.size() > majority->size() ||
          (members.size() == majority->size() && hasZero)) {
        majority = &members;
      }
    }
    const std::string where = " in " + whereText(first, false);
    if (majority == nullptr || groups.size() < 2) {
      failure.ranks = failure.seenBy;
      failure.line = fmt::format("manifest mismatch{}: {}", where, printable(first.message));
      return;
    }
    for (const auto& [key, members] : groups) {
      if (&members == majority) continue;
      failure.ranks.insert(failure.ranks.end(), members.begin(), members.end());
    }
    std::sort(failure.ranks.begin(), failure.ranks.end());
    const int reference = majority->front();
    const int odd = failure.ranks.front();
    const json& expected = *held[reference];
    const json& actual = *held[odd];
    const json mine = expected.value("manifest", json::array());
    const json theirs = actual.value("manifest", json::array());
    std::string at;
    std::size_t index = 0;
    while (index < mine.size() && index < theirs.size() && mine[index] == theirs[index]) ++index;
    if (index < mine.size() || index < theirs.size()) {
      at = fmt::format("manifest entry {}: rank {} has {}, rank {} has {}", index, reference,
                       index < mine.size() ? quoted(mine[index]) : "nothing", odd,
                       index < theirs.size() ? quoted(theirs[index]) : "nothing");
      failure.detail = {{"reference_rank", reference}, {"rank", odd},       {"index", index},
                        {"reference", index < mine.size() ? mine[index] : json()},
                        {"this_rank", index < theirs.size() ? theirs[index] : json()}};
    } else {
      at = fmt::format("the signature: rank {} has {}, rank {} has {}", reference,
                       quoted(expected.value("signature", json())), odd,
                       quoted(actual.value("signature", json())));
      failure.detail = {{"reference_rank", reference},
                        {"rank", odd},
                        {"signature", true},
                        {"reference", expected.value("signature", json())},
                        {"this_rank", actual.value("signature", json())}};
    }
    const std::string who =
        failure.ranks.size() == 1
            ? fmt::format("{} differs from rank {} at", ranksWithHosts(failure.ranks), reference)
            : fmt::format("{} differ from rank {}; rank {} at", ranksWithHosts(failure.ranks),
                          reference, odd);
    failure.line = fmt::format("manifest mismatch{}: {} {}", where, who, at);
  }

  void collectiveMismatch(const FailureView& first, FirstFailure& failure) const {
    failure.kind = std::string(kCollectiveMismatch);
    std::vector<StageGroup> groups = parseMismatchGroups(first.message);
    if (groups.empty()) {  // not the library's text: each rank's own stage
      std::map<std::string, StageGroup> byStage;
      for (const FailureView& view : views_) {
        if (view.kind != kCollectiveMismatch) continue;
        StageGroup& group = byStage[view.stage];
        group.stage = view.stage;
        group.sequence = view.sequence.value_or(0);
        group.ranks.push_back(view.rank);
      }
      for (auto& [stage, group] : byStage) groups.push_back(group);
    }
    for (const auto& group : groups)
      failure.seenBy.insert(failure.seenBy.end(), group.ranks.begin(), group.ranks.end());
    std::sort(failure.seenBy.begin(), failure.seenBy.end());
    json detail = json::array();
    for (const auto& group : groups) {
      detail.push_back({{"stage", group.stage}, {"sequence", group.sequence}, {"ranks", group.ranks}});
    }
    failure.detail = {{"groups", detail}};
    const std::string at =
        (first.sequence ? fmt::format(" at #{}", *first.sequence) : "") + stepText(first);
    if (groups.size() < 2) {
      failure.ranks = failure.seenBy;
      failure.line = fmt::format("collective mismatch{}: {}", at, printable(first.message));
      return;
    }
    // The ranks at the world's end while others were not: they skipped what the others ran.
    std::vector<const StageGroup*> atEnd;
    std::vector<const StageGroup*> elsewhere;
    for (const auto& group : groups) {
      (group.stage == kWorldEndStage ? atEnd : elsewhere).push_back(&group);
    }
    if (!atEnd.empty() && !elsewhere.empty()) {
      for (const auto* group : atEnd)
        failure.ranks.insert(failure.ranks.end(), group->ranks.begin(), group->ranks.end());
      std::sort(failure.ranks.begin(), failure.ranks.end());
      std::vector<std::string> open;
      for (const int rank : failure.ranks) {
        const auto it = byRank_.find(rank);
        if (it == byRank_.end() || !it->second->openGroups.is_array()) continue;
        const json& groupsOpen = it->second->openGroups;
        std::vector<std::string> specs;
        for (const json& spec : groupsOpen) specs.push_back(quoted(spec));
        open.push_back(fmt::format("{}{} group{} open{}",
                                   failure.ranks.size() == 1 ? "" : fmt::format("rank {}: ", rank),
                                   groupsOpen.size(), groupsOpen.size() == 1 ? "" : "s",
                                   specs.empty() ? "" : fmt::format(" ({})", fmt::join(specs, ", "))));
      }
      std::string holding;
      if (failure.ranks.size() == 1 && !open.empty()) {
        holding = " with " + open.front();
      } else if (!open.empty()) {
        holding = fmt::format(" ({})", fmt::join(open, "; "));
      }
      std::vector<std::string> others;
      for (const auto* group : elsewhere) {
        others.push_back(fmt::format("{} {} in '{}' #{}", ranksWithHosts(group->ranks),
                                     group->ranks.size() == 1 ? "was" : "were", group->stage,
                                     group->sequence));
      }
      failure.line = fmt::format(
          "collective mismatch{}: {} reached the world's end{} while {}: {} skipped collectives "
          "the others ran",
          at, ranksWithHosts(failure.ranks), holding, fmt::join(others, ", "),
          failure.ranks.size() == 1 ? "it" : "they");
      return;
    }
    // The largest group is taken as right (a tie: rank 0's, else the lowest ranks').
    const StageGroup* majority = &groups.front();
    for (const auto& group : groups) {
      const bool hasZero = std::find(group.ranks.begin(), group.ranks.end(), 0) != group.ranks.end();
      if (group.ranks.size() > majority->ranks.size() ||
          (group.ranks.size() == majority->ranks.size() && hasZero)) {
        majority = &group;
      }
    }
    std::vector<std::string> odd;
    for (const auto& group : groups) {
      if (&group == majority) continue;
      failure.ranks.insert(failure.ranks.end(), group.ranks.begin(), group.ranks.end());
      odd.push_back(fmt::format("{} entered '{}' #{}", ranksWithHosts(group.ranks), group.stage,
                                group.sequence));
    }
    std::sort(failure.ranks.begin(), failure.ranks.end());
    failure.line = fmt::format("collective mismatch{}: {} while {} entered '{}' #{}", at,
                               fmt::join(odd, ", "), ranksWithHosts(majority->ranks),
                               majority->stage, majority->sequence);
  }

  // Moves the ranks `apart` out of `absent` where some absent rank stays (the cause); whether
  // it did.
  static bool setApart(std::vector<int>& absent, const std::vector<int>& apart) {
    if (apart.empty() || apart.size() >= absent.size()) return false;
    std::vector<int> rest;
    std::set_difference(absent.begin(), absent.end(), apart.begin(), apart.end(),
                        std::back_inserter(rest));
    absent = std::move(rest);
    return true;
  }

  // Ranks that waited there too and then ended from outside (their heartbeat showed them
  // waiting in it: killed with their node while the others waited for someone else) did
  // arrive: not the cause, where another rank did not arrive.
  std::string setApartEndedThere(const FailureView& first, std::vector<int>& absent) const {
    std::vector<int> endedThere;
    std::vector<std::string> endedHow;
    for (const int rank : absent) {
      const auto it = byRank_.find(rank);
      if (it == byRank_.end()) continue;
      const FailureView& view = *it->second;
      if ((view.kind == kCrash || view.kind == kStopped) && view.waitedIn &&
          view.waitedIn->first == first.stage &&
          (first.stage == kWorldEndStage || view.waitedIn->second == first.sequence)) {
        endedThere.push_back(rank);
        endedHow.push_back(fmt::format("rank {}: {}", rank, printable(view.message)));
      }
    }
    if (!setApart(absent, endedThere)) return std::string();
    return fmt::format("; {} waited there too, then ended ({})", ranksWithHosts(endedThere),
                       fmt::join(endedHow, "; "));
  }

  // Ranks whose fate is not known here (a result that had no way to the reporter, no end
  // record): where another absent rank is known to have ended, that one is the cause, and
  // these are named apart, not as ranks that never arrived.
  std::string setApartUnknown(std::vector<int>& absent) const {
    std::vector<int> unknown;
    std::map<std::string, std::vector<int>> unknownWhy;  // one text for ranks that share it
    for (const int rank : absent) {
      const auto it = byRank_.find(rank);
      if (it != byRank_.end() && it->second->kind == kMissing && it->second->stage != "join") {
        unknown.push_back(rank);
        unknownWhy[printable(it->second->message)].push_back(rank);
      }
    }
    std::vector<std::string> unknownHow;
    for (const auto& [why, members] : unknownWhy) {
      unknownHow.push_back(fmt::format("{} {}: {}", members.size() == 1 ? "rank" : "ranks",
                                       rankRanges(members), why));
    }
    if (!setApart(absent, unknown)) return std::string();
    return fmt::format("; what became of {} is not known here ({})", ranksWithHosts(unknown),
                       fmt::join(unknownHow, "; "));
  }

  // Ranks that lost the store on their way there (its host, rank 0, ended while they finished
  // their join, say: chaos seed 53752704) follow from the absent rank that did not come.
  std::string setApartStoreLost(std::vector<int>& absent) const {
    std::vector<int> lost;
    std::vector<std::string> lostHow;
    for (const int rank : absent) {
      const auto it = byRank_.find(rank);
      if (it != byRank_.end() && it->second->kind == kStoreLost) {
        lost.push_back(rank);
        lostHow.push_back(fmt::format("rank {}: {}", rank, printable(it->second->message)));
      }
    }
    if (!setApart(absent, lost)) return std::string();
    return fmt::format("; {} lost the store after it ({})", ranksWithHosts(lost),
                       fmt::join(lostHow, "; "));
  }

  void hang(const FailureView& first, FirstFailure& failure) const {
    // At the world's end each rank counts its own collectives: any rank waiting there waits
    // for the same thing.
    failure.seenBy = ranksWith("wait", first.stage == kWorldEndStage ? std::nullopt : first.sequence,
                               first.stage);
    std::vector<int> absent;
    for (int rank = 0; rank < worldSize_; ++rank) {
      if (!std::binary_search(failure.seenBy.begin(), failure.seenBy.end(), rank)) {
        absent.push_back(rank);
      }
    }
    // The absent ranks that are not the cause, where another is: said after the line.
    std::string endedText = setApartEndedThere(first, absent);
    endedText += setApartUnknown(absent);
    endedText += setApartStoreLost(absent);
    if (absent.empty()) {
      // Every rank waited there: those that came after the others had given up ("it arrived
      // after ranks [1] had left this collective") are the late ones, the cause.
      for (const FailureView& view : views_) {
        if (std::binary_search(failure.seenBy.begin(), failure.seenBy.end(), view.rank) &&
            view.message.find("it arrived after ranks") != std::string::npos) {
          absent.push_back(view.rank);
        }
      }
      if (!absent.empty()) {
        std::vector<int> waited;
        std::set_difference(failure.seenBy.begin(), failure.seenBy.end(), absent.begin(),
                            absent.end(), std::back_inserter(waited));
        failure.kind = std::string(kHang);
        failure.ranks = absent;
        failure.line = fmt::format(
            "hang in {}: {} waited there until the deadline; {} arrived after {} had left",
            whereText(first, false),
            ranksWithHosts(waited), ranksWithHosts(absent), waited.size() == 1 ? "it" : "they");
        return;
      }
    }
    if (absent.empty()) absent = ranksNamedIn(first.message);
    std::vector<int> crashed;
    std::vector<std::string> how;
    for (const int rank : absent) {
      const auto it = byRank_.find(rank);
      if (it == byRank_.end()) {
        if (auto where = whereabouts_.find(rank); where != whereabouts_.end()) {
          how.push_back(fmt::format("rank {}: {}", rank, where->second));
        }
        continue;
      }
      const std::string& kind = it->second->kind;
      if (kind == kCrash || kind == kStopped || kind == kMissing) {
        // A stop (a signal, a launcher's teardown) may have come after the hang, as the
        // launcher ended the job: not a crash.
        if (kind == kCrash) crashed.push_back(rank);
        how.push_back(fmt::format("rank {}: {}", rank, printable(it->second->message)));
      }
    }
    failure.ranks = absent;
    const std::string where = whereText(first, false);
    const std::string waiters = ranksWithHosts(failure.seenBy);
    if (!absent.empty() && crashed.size() == absent.size()) {
      failure.kind = std::string(kCrash);
      failure.line =
          fmt::format("crash: {} ended without reaching {} ({}); {} waited for {} there",
                      ranksWithHosts(absent), where, fmt::join(how, "; "), waiters,
                      absent.size() == 1 ? "it" : "them") +
          endedText;
      return;
    }
    failure.kind = std::string(kHang);
    const std::string missing =
        absent.empty() ? std::string("the ranks that did not arrive are not known")
                       : fmt::format("{} never arrived", ranksWithHosts(absent));
    failure.line = fmt::format("hang in {}: {} waited there; {}", where, waiters, missing);
    if (!how.empty()) failure.line += fmt::format(" ({})", fmt::join(how, "; "));
    failure.line += endedText;
  }

  // " (step 4)" for hmc-run's steps.
  static std::string stepText(const FailureView& view) {
    return view.step ? fmt::format(" (step {})", *view.step) : std::string();
  }

  void other(const FailureView& first, FirstFailure& failure) const {
    // Ranks that never joined a world stopped while it formed: the stop, in the join.
    const bool notJoined = first.kind == kMissing && first.stage == "join";
    failure.kind = notJoined             ? std::string(kStopped)
                   : first.kind == kMissing ? std::string(kHang)
                   : first.kind == kCrash || first.kind == kStopped || first.kind == kLeak ||
                           first.kind == kStoreLost || first.kind == "unmet"
                       ? first.kind
                       : std::string(kError);
    const auto key = orderOf(first);
    for (const FailureView& view : views_) {
      const auto at = orderOf(view);
      if (view.kind == first.kind && std::get<0>(at) == std::get<0>(key) &&
          std::get<1>(at) == std::get<1>(key) &&
          (failure.kind != kError || view.message == first.message)) {
        failure.seenBy.push_back(view.rank);
      }
    }
    std::sort(failure.seenBy.begin(), failure.seenBy.end());
    failure.ranks = failure.kind == kError ? ranksNamedIn(first.message) : std::vector<int>{};
    if (failure.ranks.empty()) failure.ranks = failure.seenBy;
    std::string where = whereText(first, true);
    if (!where.empty()) where = " in " + where;
    if (failure.kind == kError) {
      failure.line = fmt::format("error{} on {}: {}", where, ranksWithHosts(failure.seenBy),
                                 printable(first.message));
    } else if (notJoined) {
      failure.line = fmt::format("stopped in the world's join: {} {}",
                                 ranksWithHosts(failure.seenBy), printable(first.message));
    } else if (first.kind == kStoreLost) {
      failure.line = fmt::format("lost the store{}: {}: {}", where, ranksWithHosts(failure.seenBy),
                                 printable(first.message));
    } else if (first.kind == kMissing) {
      failure.line = fmt::format("hang: {} did not reach the world's end: {}",
                                 ranksWithHosts(failure.seenBy), printable(first.message));
    } else {
      failure.line = fmt::format("{}: {}: {}", failure.kind, ranksWithHosts(failure.seenBy),
                                 printable(first.message));
    }
  }

  const std::vector<FailureView>& views_;
  int worldSize_;
  const std::vector<std::string>& hosts_;
  const std::map<int, std::string>& whereabouts_;
  std::map<int, const FailureView*> byRank_;
  bool manyHosts_ = false;
};

json optional(const std::optional<std::uint64_t>& value) {
  return value ? json(*value) : json(nullptr);
}

}  // namespace

json FailureView::toJson() const {
  json out = {{"rank", rank},   {"host", host}, {"kind", kind},      {"stage", stage},
              {"sequence", optional(sequence)}, {"collectives_before", collectivesBefore},
              {"op", op},       {"message", message}};
  out["step"] = step ? json(*step) : json(nullptr);
  if (!mismatch.is_null()) out["mismatch"] = mismatch;
  if (!openGroups.is_null()) out["open_groups"] = openGroups;
  return out;
}

FailureView FailureView::fromJson(const json& value) {
  FailureView view;
  view.rank = value.at("rank").get<int>();
  view.host = value.value("host", "");
  view.kind = value.at("kind").get<std::string>();
  view.stage = value.value("stage", "");
  if (value.contains("sequence") && !value.at("sequence").is_null()) {
    view.sequence = value.at("sequence").get<std::uint64_t>();
  }
  view.collectivesBefore = value.value("collectives_before", std::uint64_t{0});
  if (value.contains("step") && !value.at("step").is_null()) view.step = value.at("step").get<int>();
  view.op = value.value("op", "");
  view.message = value.value("message", "");
  view.mismatch = value.value("mismatch", json());
  view.openGroups = value.value("open_groups", json());
  return view;
}

bool Diagnosis::hang() const {
  return first && (first->kind == kHang || first->kind == kCrash);
}

std::map<int, std::string> Diagnosis::consequenceByRank() const {
  std::map<int, std::string> out;
  for (const auto& consequence : consequences) out[consequence.rank] = consequence.line;
  return out;
}

json Diagnosis::toJson() const {
  json out;
  if (first) {
    json failure = {{"kind", first->kind},   {"stage", first->stage},
                    {"sequence", optional(first->sequence)},
                    {"ranks", first->ranks}, {"hosts", first->hosts},
                    {"seen_by", first->seenBy}, {"line", first->line},
                    {"detail", first->detail}};
    failure["step"] = first->step ? json(*first->step) : json(nullptr);
    out["first_failure"] = std::move(failure);
  } else {
    out["first_failure"] = nullptr;
  }
  json consequencesJson = json::array();
  for (const auto& consequence : consequences) {
    consequencesJson.push_back(
        {{"rank", consequence.rank}, {"line", consequence.line}, {"follows_from", "first_failure"}});
  }
  out["consequences"] = std::move(consequencesJson);
  return out;
}

Diagnosis diagnose(const std::vector<FailureView>& views, int worldSize,
                   const std::vector<std::string>& hosts,
                   const std::map<int, std::string>& whereabouts) {
  return Builder(views, worldSize, hosts, whereabouts).build();
}

std::vector<int> ranksNamedIn(const std::string& message) {
  static const std::regex kList(
      R"(ranks \[([0-9, ]*)\] did not (arrive|join)|failed on ranks \[([0-9, ]*)\])");
  static const std::regex kOne(R"(rank ([0-9]+) (closed its connection|was announced dead))");
  static const std::regex kNumber("[0-9]+");
  std::vector<int> ranks;
  std::smatch match;
  if (std::regex_search(message, match, kList)) {
    const std::string list = match[1].matched ? match[1].str() : match[3].str();
    for (auto it = std::sregex_iterator(list.begin(), list.end(), kNumber);
         it != std::sregex_iterator(); ++it) {
      ranks.push_back(std::stoi(it->str()));
    }
  } else if (std::regex_search(message, match, kOne)) {
    ranks.push_back(std::stoi(match[1].str()));
  }
  return ranks;
}

std::string failureKindOf(std::string_view errorKind, bool manifestMismatch) {
  if (manifestMismatch) return std::string(kManifestMismatch);
  if (errorKind == "collective_mismatch" || errorKind == "timeout" ||
      errorKind == "rank_failure") {
    return std::string(errorKind);
  }
  return std::string(kError);
}

std::vector<StageGroup> parseMismatchGroups(std::string_view message) {
  static const std::regex kGroup(R"(ranks \[([0-9, ]*)\] entered '([^']*)' #([0-9]+))");
  static const std::regex kNumber("[0-9]+");
  std::vector<StageGroup> groups;
  const std::string text(message);
  if (text.find("ranks entered different collectives") == std::string::npos) return groups;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kGroup);
       it != std::sregex_iterator(); ++it) {
    StageGroup group;
    const std::string list = (*it)[1].str();
    for (auto n = std::sregex_iterator(list.begin(), list.end(), kNumber);
         n != std::sregex_iterator(); ++n) {
      group.ranks.push_back(std::stoi(n->str()));
    }
    group.stage = (*it)[2].str();
    group.sequence = std::stoull((*it)[3].str());
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace hmc::diagnostics
