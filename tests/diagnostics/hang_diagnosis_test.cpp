// `hmc-run status` and the report say "who never arrived where" in the same words: the
// report's scenario::diagnoseHang goes through diagnostics::diagnoseWaits (lib/diagnostics).

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "hmc/diagnostics/hang_diagnosis.hpp"
#include "hmc/scenario/report.hpp"

namespace {

namespace dx = hmc::diagnostics;
using hmc::scenario::RankResult;
using hmc::scenario::StepStatus;

dx::FlightEntry entry(std::uint64_t sequence, std::string stage, int step, std::string status) {
  dx::FlightEntry out;
  out.sequence = sequence;
  out.stage = std::move(stage);
  out.step = step;
  out.status = std::move(status);
  if (out.status != "in_flight") out.endS = 1.0;
  return out;
}

}  // namespace

TEST_SUITE("hang diagnosis") {
  TEST_CASE("the shared diagnosis says what the report says") {
    std::vector<RankResult> ranks(4);
    for (int r = 0; r < 4; ++r) ranks[r].rank = r;
    ranks[0].hung = true;
    ranks[0].flight = {entry(0, "recycle", 1, "ok"), entry(1, "close validation", 2, "timeout")};
    ranks[1].flight = {entry(0, "recycle", 1, "ok")};
    ranks[1].steps.resize(1);
    ranks[2].flight = {entry(0, "recycle", 1, "ok")};
    ranks[2].steps.resize(1);
    ranks[2].steps.back().status = StepStatus::kNotRun;
    ranks[3].crashed = true;
    ranks[3].crashReason = "rank 3 exited with status 17 (fault crash)";
    // The report's diagnoseHang maps its ranks onto diagnoseWaits: the words are the shared ones.
    CHECK(hmc::scenario::diagnoseHang(ranks) ==
          "rank 0 waits in 'close validation' #1 (step 2); rank 1 never arrived: last completed "
          "'recycle' #0 (step 1), finished its steps; rank 2 never arrived: last completed "
          "'recycle' #0 (step 1), stopped early; rank 3 crashed (rank 3 exited with status 17 "
          "(fault crash)); no collective completed");

    ranks[0].flight.back().status = "rank_failure";
    ranks[3].crashReason.reset();
    CHECK(hmc::scenario::diagnoseHang(ranks) ==
          "rank 0 waits in 'close validation' #1 (step 2), a peer failed; rank 1 never arrived: "
          "last completed 'recycle' #0 (step 1), finished its steps; rank 2 never arrived: last "
          "completed 'recycle' #0 (step 1), stopped early; rank 3 crashed (exited); no collective "
          "completed");

    ranks[0].hung = false;
    CHECK(hmc::scenario::diagnoseHang(ranks).empty());
  }
}
