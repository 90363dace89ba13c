// `hmc-run status` and the report say "who never arrived where" in the same words:
// diagnostics::diagnoseWaits (shared, lib/diagnostics) against the report's
// scenario::diagnoseHang on the same ranks.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "hmc/diagnostics/hang_diagnosis.hpp"
#include "hmc/scenario/report.hpp"

namespace {

namespace dx = hmc::diagnostics;
using hmc::scenario::RankResult;
using hmc::scenario::StepResult;
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

// What the report knows of a rank, as the shared diagnosis takes it.
std::vector<dx::RankWhereabouts> whereabouts(const std::vector<RankResult>& ranks) {
  std::vector<dx::RankWhereabouts> out;
  for (const auto& rank : ranks) {
    dx::RankWhereabouts place;
    place.rank = rank.rank;
    place.flight = rank.flight;
    place.hung = rank.hung;
    if (rank.crashed) place.gone = rank.crashReason.value_or("exited");
    const bool finished = !rank.steps.empty() && rank.steps.back().status != StepStatus::kNotRun;
    place.elsewhere = finished ? "finished its steps" : "stopped early";
    out.push_back(std::move(place));
  }
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
    const std::string report = hmc::scenario::diagnoseHang(ranks);
    CHECK_FALSE(report.empty());
    CHECK(dx::diagnoseWaits(whereabouts(ranks)) == report);

    ranks[0].flight.back().status = "rank_failure";
    ranks[3].crashReason.reset();
    CHECK(dx::diagnoseWaits(whereabouts(ranks)) == hmc::scenario::diagnoseHang(ranks));

    ranks[0].hung = false;
    CHECK(hmc::scenario::diagnoseHang(ranks).empty());
    CHECK(dx::diagnoseWaits(whereabouts(ranks)).empty());
  }
}
