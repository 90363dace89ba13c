// The diagnosis model (hmc/diagnostics/diagnosis.hpp): which failure is first, which ranks it
// names, and what follows from it. Each case has a wrong answer a looser model would give (the
// later failure, the waiting rank, rank 0 by default): the checks name the right one.

#include "hmc/diagnostics/diagnosis.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "hmc/error.hpp"
#include "support/thread_ranks.hpp"

namespace {

namespace dx = hmc::diagnostics;
using nlohmann::json;

dx::FailureView view(int rank, std::string kind, std::string stage,
                     std::optional<std::uint64_t> sequence, std::string message) {
  dx::FailureView out;
  out.rank = rank;
  out.kind = std::move(kind);
  out.stage = std::move(stage);
  out.sequence = sequence;
  out.collectivesBefore = sequence.value_or(0);
  out.message = std::move(message);
  return out;
}

// The manager's diagnosis document (ResourceManager::lastMismatch) for these manifests.
json mismatchOf(const std::vector<json>& manifests) {
  json ranks = json::array();
  for (std::size_t rank = 0; rank < manifests.size(); ++rank) {
    ranks.push_back({{"rank", rank}, {"manifest", manifests[rank]}});
  }
  return {{"stage", "close validation"}, {"ranks", ranks}};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_SUITE("diagnosis") {
  TEST_CASE("a manifest mismatch names the rank that differs, not rank 0, and what each holds") {
    const json manifests = mismatchOf({json::array({json::array({0, "a"}), json::array({1, "b"})}),
                                       json::array({json::array({0, "a"}), json::array({1, "b"})}),
                                       json::array({json::array({1, "b"}), json::array({0, "a"})})});
    std::vector<dx::FailureView> views;
    for (int rank = 0; rank < 3; ++rank) {
      views.push_back(view(rank, "manifest_mismatch", "close validation", 26,
                           "multicore resource manifests differ across ranks"));
      views.back().mismatch = manifests;
    }
    const dx::Diagnosis diagnosis = dx::diagnose(views, 3);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "manifest_mismatch");
    CHECK(diagnosis.first->ranks == std::vector<int>{2});
    CHECK(diagnosis.first->seenBy == std::vector<int>{0, 1, 2});
    CHECK(diagnosis.first->sequence == 26u);
    CHECK(diagnosis.first->line ==
          "manifest mismatch in 'close validation' #26: rank 2 differs from rank 0 at manifest "
          "entry 0: rank 0 has [0,\"a\"], rank 2 has [1,\"b\"]");
    CHECK_FALSE(diagnosis.hang());
    CHECK(diagnosis.consequences.empty());
  }

  TEST_CASE("when rank 0 is the odd one of three, rank 0 is named against rank 1") {
    const json manifests =
        mismatchOf({json::array({7}), json::array({8}), json::array({8})});
    std::vector<dx::FailureView> views;
    for (int rank = 0; rank < 3; ++rank) {
      views.push_back(view(rank, "manifest_mismatch", "recycle", 4, "differ"));
      views.back().mismatch = manifests;
    }
    const auto diagnosis = dx::diagnose(views, 3);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->ranks == std::vector<int>{0});
    CHECK(contains(diagnosis.first->line, "rank 0 differs from rank 1 at manifest entry 0: rank 1 "
                                          "has 8, rank 0 has 7"));
  }

  TEST_CASE("the earliest collective is first, whatever the kinds, and the rest follow from it") {
    std::vector<dx::FailureView> views = {
        view(0, "timeout", "recycle", 2, "'recycle' #2 timed out on rank 0 after 2 s: ranks [1] "
                                          "did not arrive"),
        view(1, "manifest_mismatch", "close validation", 5, "later"),
    };
    const auto diagnosis = dx::diagnose(views, 2);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "hang");
    CHECK(diagnosis.first->ranks == std::vector<int>{1});
    CHECK(diagnosis.first->seenBy == std::vector<int>{0});
    CHECK(diagnosis.hang());
    REQUIRE(diagnosis.consequences.size() == 1);
    CHECK(diagnosis.consequences[0].rank == 1);
    CHECK(contains(diagnosis.consequences[0].line, "(follows from the first failure)"));
  }

  TEST_CASE("a rank that reached the world's end while the others closed is named with its groups") {
    // The library's own mismatch text, from two thread ranks in different stages.
    const auto outcomes = hmc::testing::runThreadRanks(3, [](int rank, auto collective) {
      collective->barrier(rank == 2 ? dx::kWorldEndStage : std::string_view("close validation"));
    });
    const std::string text = outcomes[0].message();
    REQUIRE(outcomes[0].kind() == "collective_mismatch");
    CHECK(outcomes[2].message() == text);
    const auto groups = dx::parseMismatchGroups(text);
    REQUIRE(groups.size() == 2);

    std::vector<dx::FailureView> views;
    for (int rank = 0; rank < 3; ++rank) {
      views.push_back(view(rank, "collective_mismatch", rank == 2 ? "world end" : "close validation",
                           0, text));
    }
    views[2].openGroups = json::array({{{"type", "scratch_linear"}, {"features", 64}}});
    const auto first = dx::diagnose(views, 3);
    REQUIRE(first.first);
    CHECK(first.first->kind == "collective_mismatch");
    CHECK(first.first->ranks == std::vector<int>{2});
    CHECK(first.first->seenBy == std::vector<int>{0, 1, 2});
    CHECK(contains(first.first->line, "rank 2 reached the world's end with 1 group open "
                                      "({\"features\":64,\"type\":\"scratch_linear\"})"));
    CHECK(contains(first.first->line, "while ranks [0, 1] were in 'close validation' #0"));

  }

  TEST_CASE("two stages without the world's end: the smaller group is named") {
    const std::string text =
        "ranks entered different collectives at #3: ranks [0, 2, 3] entered 'close validation' "
        "#3, ranks [1] entered 'recycle' #3; every rank must run the same collectives in the "
        "same order";
    std::vector<dx::FailureView> views;
    for (int rank = 0; rank < 4; ++rank) {
      views.push_back(view(rank, "collective_mismatch", rank == 1 ? "recycle" : "close validation",
                           3, text));
    }
    const auto diagnosis = dx::diagnose(views, 4);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->ranks == std::vector<int>{1});
    CHECK(diagnosis.first->line ==
          "collective mismatch at #3: rank 1 entered 'recycle' #3 while ranks [0, 2, 3] entered "
          "'close validation' #3");
  }

  TEST_CASE("a lost rank whose process ended is a crash; a silent one is a hang; hosts named") {
    std::vector<dx::FailureView> views = {
        view(0, "rank_failure", "recycle", 5, "rank 1 closed its connection in 'recycle' #5"),
        view(2, "rank_failure", "recycle", 5, "rank 1 closed its connection in 'recycle' #5"),
    };
    views[0].host = "h1";
    views[1].host = "h1";
    dx::FailureView crashed = view(1, "crash", "", std::nullopt, "exited with status 17");
    crashed.host = "h2";
    views.push_back(crashed);
    const auto crash = dx::diagnose(views, 3);
    REQUIRE(crash.first);
    CHECK(crash.first->kind == "crash");
    CHECK(crash.first->ranks == std::vector<int>{1});
    CHECK(crash.first->hosts == std::vector<std::string>{"h2"});
    CHECK(crash.first->seenBy == std::vector<int>{0, 2});
    CHECK(contains(crash.first->line, "rank 1 (host h2) ended without reaching 'recycle' #5"));
    CHECK(crash.hang());

    views.pop_back();  // rank 1 left no trace: it never came
    const auto hang = dx::diagnose(views, 3, {"h1", "h2", "h1"});
    REQUIRE(hang.first);
    CHECK(hang.first->kind == "hang");
    CHECK(hang.first->ranks == std::vector<int>{1});
    CHECK(hang.first->hosts == std::vector<std::string>{"h2"});
    CHECK(contains(hang.first->line, "rank 1 (host h2) never arrived"));
  }

  TEST_CASE("a rank that came after the others gave up is named, not 'not known'") {
    std::vector<dx::FailureView> views = {
        view(0, "timeout", "recycle", 0,
             "'recycle' #0 timed out on rank 0: it arrived after ranks [1] had left this "
             "collective (they gave up waiting)"),
        view(1, "timeout", "recycle", 0,
             "'recycle' #0 timed out on rank 1 after 2 s: ranks [0] did not arrive"),
    };
    const auto diagnosis = dx::diagnose(views, 2);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "hang");
    CHECK(diagnosis.first->ranks == std::vector<int>{0});
    CHECK(diagnosis.first->line ==
          "hang in 'recycle' #0: rank 1 waited there until the deadline; rank 0 arrived after it "
          "had left");
  }

  TEST_CASE("ranks that waited in the hang and then ended with their node are not its cause") {
    // Ranks 0 and 1 wait in 'close validation' #4 for rank 2, which skipped its close; ranks 3
    // and 4 waited there too (their heartbeats said so) and were killed with their host.
    std::vector<dx::FailureView> views = {
        view(0, "rank_failure", "close validation", 4, "stopped by signal 15 while waiting"),
        view(1, "rank_failure", "close validation", 4, "stopped by signal 15 while waiting"),
        view(2, "stopped", "", std::nullopt, "stopped by the launcher's teardown after its steps"),
    };
    views[0].host = views[1].host = "h1";
    views[2].host = "h2";
    for (const int rank : {3, 4}) {
      dx::FailureView lost = view(rank, "crash", "", std::nullopt,
                                  "its connection with rank 0 had closed");
      lost.host = "h3";
      lost.waitedIn = std::make_pair(std::string("close validation"), std::uint64_t{4});
      views.push_back(lost);
    }
    const auto diagnosis = dx::diagnose(views, 5);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "hang");
    CHECK(diagnosis.first->ranks == std::vector<int>{2});
    CHECK(contains(diagnosis.first->line, "rank 2 (host h2) never arrived"));
    CHECK(contains(diagnosis.first->line,
                   "ranks [3 (host h3), 4 (host h3)] waited there too, then ended (rank 3: its "
                   "connection with rank 0 had closed"));
    // In another collective, or with no other rank missing, they are what did not arrive.
    views[3].waitedIn->second = 3;
    views[4].waitedIn->second = 3;
    const auto elsewhere = dx::diagnose(views, 5);
    REQUIRE(elsewhere.first);
    CHECK(elsewhere.first->ranks == std::vector<int>{2, 3, 4});
    // Rank 2 waited there too: the lost ranks are all that is missing, and what the others
    // waited for.
    views[2] = view(2, "rank_failure", "close validation", 4, "stopped by signal 15 while waiting");
    views[3].waitedIn->second = 4;
    views[4].waitedIn->second = 4;
    const auto alone = dx::diagnose(views, 5);
    REQUIRE(alone.first);
    CHECK(alone.first->kind == "crash");
    CHECK(alone.first->ranks == std::vector<int>{3, 4});
  }

  TEST_CASE("ranks whose fate is not known here are not the cause beside a known crash") {
    // Rank 0 (the store's host) crashed by plan; rank 1, on its host, waited for it and reports
    // in its place; ranks 2-3 run on another host: their results had no way here ('missing',
    // no stage). The crash is the cause; ranks 2-3 are named apart, not as ranks that never
    // arrived (the report called them crashed, then 'never arrived' in a hang).
    const std::string lost = "no result: it runs on another host than rank 1 (h1)";
    std::vector<dx::FailureView> views = {
        view(0, "crash", "", std::nullopt, "rank 0's process ended without a result"),
        view(1, "rank_failure", "close validation", 1,
             "rank 0 closed its connection in 'close validation' #1"),
        view(2, "missing", "", std::nullopt, lost),
        view(3, "missing", "", std::nullopt, lost),
    };
    const auto diagnosis = dx::diagnose(views, 4);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "crash");
    CHECK(diagnosis.first->ranks == std::vector<int>{0});
    CHECK(contains(diagnosis.first->line,
                   "crash: rank 0 ended without reaching 'close validation' #1 (rank 0: rank 0's "
                   "process ended without a result); rank 1 waited for it there"));
    CHECK(contains(diagnosis.first->line,
                   "what became of ranks [2, 3] is not known here (ranks 2-3: " + lost + ")"));
    // With no known cause beside them, they are what the waiting rank did not get.
    views[0] = view(0, "rank_failure", "close validation", 1, "rank 2 did not arrive");
    const auto alone = dx::diagnose(views, 4);
    REQUIRE(alone.first);
    CHECK(alone.first->kind == "hang");
    CHECK(alone.first->ranks == std::vector<int>{2, 3});
  }

  TEST_CASE("a rank that lost the store in its join follows from the crash that ended it") {
    // chaos seed 53752704 (torchrun, one host): rank 0, the store's host, crashed right after
    // its join while rank 2 still set its world up: rank 2's connection to the store failed and
    // it wrote that end (store_lost, in the join). Rank 1, reporting in rank 0's place, named
    // ranks [0, 2] as never arriving in a hang (before: rank 2 crashed beside rank 0).
    const std::string lost = "hmc::joinWorld failed after the join: Connection reset by peer";
    std::vector<dx::FailureView> views = {
        view(0, "crash", "", std::nullopt, "rank 0's process ended without a result"),
        view(1, "rank_failure", "close validation", 0,
             "rank 0 closed its connection in 'close validation' #0"),
        view(2, "store_lost", "join", std::nullopt, lost),
    };
    const auto diagnosis = dx::diagnose(views, 3);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "crash");
    CHECK(diagnosis.first->ranks == std::vector<int>{0});
    CHECK(contains(diagnosis.first->line,
                   "crash: rank 0 ended without reaching 'close validation' #0"));
    CHECK(contains(diagnosis.first->line, "; rank 2 lost the store after it (rank 2: " + lost));
    // Alone (every other rank waited there), the rank that lost the store is the one missing.
    views[0] = view(0, "rank_failure", "close validation", 0, "rank 2 did not arrive");
    const auto alone = dx::diagnose(views, 3);
    REQUIRE(alone.first);
    CHECK(alone.first->kind == "hang");
    CHECK(alone.first->ranks == std::vector<int>{2});
    CHECK(contains(alone.first->line, "rank 2 never arrived"));
  }

  TEST_CASE("ranks that lost the store at the world's end come before the teardown it caused") {
    // h3 cut off while its ranks met at the world's end: they could not reach the store, gave
    // up and exited 1; mpirun tore the job down: ranks 0-1 stopped, ranks 2-3 of h2 had not
    // published their end yet. The report named ranks 2-3 as the first failure.
    const std::string lost = "the store at h1:29510 failed at the world's end: no answer";
    std::vector<dx::FailureView> views = {
        view(0, "stopped", "", std::nullopt, "stopped by mpirun's teardown"),
        view(1, "stopped", "", std::nullopt, "stopped by mpirun's teardown"),
        view(2, "missing", "", std::nullopt, "no end within 0.4 s"),
        view(3, "missing", "", std::nullopt, "no end within 0.4 s"),
        view(4, "store_lost", "world end", 5, lost),
        view(5, "store_lost", "world end", 5, lost),
    };
    const std::vector<std::string> hosts = {"h1", "h1", "h2", "h2", "h3", "h3"};
    const auto diagnosis = dx::diagnose(views, 6, hosts);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "store_lost");
    CHECK(diagnosis.first->ranks == std::vector<int>{4, 5});
    CHECK(diagnosis.first->hosts == std::vector<std::string>{"h3"});
    CHECK(diagnosis.first->line ==
          "lost the store in 'world end' #5: ranks [4 (host h3), 5 (host h3)]: " + lost);
    CHECK(diagnosis.consequences.size() == 4);
    // A crash (the store's host itself, say) comes first: the lost store follows from it.
    views[0] = view(0, "crash", "", std::nullopt, "killed by signal 9");
    const auto crashed = dx::diagnose(views, 6, hosts);
    REQUIRE(crashed.first);
    CHECK(crashed.first->kind == "crash");
    CHECK(crashed.first->ranks == std::vector<int>{0});
  }

  TEST_CASE("ranks stopped by the teardown while they waited there are not the missing ones") {
    // Rank 4 crashed by plan; mpirun's teardown stopped ranks 0-1 while they waited in 'close
    // validation' #0 beside ranks 2, 3 and 5. The report named ranks [0, 1, 4] as never arriving.
    std::vector<dx::FailureView> views;
    for (const int rank : {2, 3, 5}) {
      views.push_back(view(rank, "timeout", "close validation", 0, "no end within 0.4 s"));
    }
    for (const int rank : {0, 1}) {
      dx::FailureView stopped = view(rank, "stopped", "", std::nullopt,
                                     "stopped by mpirun's teardown while waiting in 'close "
                                     "validation' #0");
      stopped.waitedIn = std::make_pair(std::string("close validation"), std::uint64_t{0});
      views.push_back(stopped);
    }
    views.push_back(view(4, "crash", "", std::nullopt, "its connection with rank 0 had closed"));
    const auto diagnosis = dx::diagnose(views, 6);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "crash");
    CHECK(diagnosis.first->ranks == std::vector<int>{4});
    CHECK(contains(diagnosis.first->line, "ranks [0, 1] waited there too, then ended"));
  }

  TEST_CASE("a crash comes before the stops of the launcher's teardown that follow it") {
    std::vector<dx::FailureView> views;
    for (const int rank : {0, 1, 3}) {
      views.push_back(view(rank, "stopped", "", std::nullopt,
                           "stopped by mpirun's teardown (its SIGCONT, then SIGTERM)"));
    }
    views.push_back(view(2, "crash", "", std::nullopt, "exited with status 17"));
    const auto diagnosis = dx::diagnose(views, 4);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "crash");
    CHECK(diagnosis.first->ranks == std::vector<int>{2});
    CHECK(diagnosis.consequences.size() == 3);
  }

  TEST_CASE("a local error comes before the collective its rank would have entered next") {
    dx::FailureView local = view(1, "error", "", std::nullopt,
                                 "multicore resources are bound to the first input device/dtype "
                                 "cpu/float32, got cpu/float64.");
    local.collectivesBefore = 4;
    local.op = "forward";
    std::vector<dx::FailureView> views = {
        view(0, "timeout", "close validation", 4, "'close validation' #4 timed out"), local};
    const auto diagnosis = dx::diagnose(views, 2);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "error");
    CHECK(diagnosis.first->ranks == std::vector<int>{1});
    CHECK(contains(diagnosis.first->line, "error in forward on rank 1: multicore resources"));
    REQUIRE(diagnosis.consequences.size() == 1);
    CHECK(diagnosis.consequences[0].rank == 0);
  }

  TEST_CASE("a collective call's error names the ranks where it failed, not those that saw it") {
    std::vector<dx::FailureView> views;
    for (int rank = 0; rank < 3; ++rank) {
      views.push_back(view(rank, "error", "multicore resource close", 7,
                           "multicore resource close failed on ranks [1]: RuntimeError: boom"));
    }
    const auto diagnosis = dx::diagnose(views, 3);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->ranks == std::vector<int>{1});
    CHECK(diagnosis.first->seenBy == std::vector<int>{0, 1, 2});
  }

  TEST_CASE("nothing failed: no first failure; JSON round trip of a view") {
    CHECK_FALSE(dx::diagnose({}, 4).first);
    CHECK(dx::diagnose({}, 4).toJson()["first_failure"].is_null());
    dx::FailureView original = view(3, "timeout", "recycle", 9, "late");
    original.host = "h3";
    original.step = 4;
    original.op = "forward";
    original.openGroups = json::array({1});
    const dx::FailureView copy = dx::FailureView::fromJson(original.toJson());
    CHECK(copy.toJson() == original.toJson());
  }
}
