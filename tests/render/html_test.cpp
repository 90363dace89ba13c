// The renderers of hmc/render: the HTML page of a report (or a set) and of a comparison, and
// the Markdown table of a comparison, from their JSON documents alone.
#include "hmc/render/html.hpp"

#include <doctest/doctest.h>

#include <string>

#include "hmc/error.hpp"
#include "hmc/render/markdown.hpp"

namespace {

using nlohmann::json;
using namespace hmc::render;

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

json step(int index, const char* op, const char* status, bool expected = true) {
  return {{"index", index},       {"op", op},         {"module", "a"},          {"status", status},
          {"expected", expected}, {"seconds", 0.001}, {"start_s", 0.01 * index}};
}

// The report of skipped-close-hang as docs/scenario-format.md shows it, shortened.
json hangReport() {
  json hung = step(2, "close_all", "hang", false);
  hung["error"] = {
      {"kind", "timeout"},
      {"message", "'close validation' #1 timed out on rank 0: ranks [1] did not arrive"}};
  return {
      {"format", "hmc-report/1"},
      {"scenario", "skipped-close-hang"},
      {"world_size", 2},
      {"outcome", "hang"},
      {"ranks",
       {{{"rank", 0},
         {"host", "node-a"},
         {"pid", 101},
         {"steps",
          {step(0, "create", "ok"), step(1, "forward", "ok"), hung, step(3, "check", "not_run")}}},
        {{"rank", 1},
         {"host", "node-b"},
         {"pid", 202},
         {"steps",
          {step(0, "create", "ok"), step(1, "forward", "ok"), step(2, "close_all", "skipped"),
           step(3, "check", "ok")}}}}},
      {"mismatches", json::array()},
      {"leaks",
       {{"leaked", true},
        {"ranks",
         {{{"rank", 0},
           {"checked", false},
           {"leaked", true},
           {"groups", 1},
           {"reason", "this rank hung: the automatic shutdown was skipped"}}}}}},
      {"timings",
       {{"fresh_bind", {{"count", 2}, {"p50", 0.0003}, {"p95", 0.007}, {"max", 0.007}}}}},
      {"hang",
       {{"diagnosis",
         "rank 0 waits in 'close validation' #1 (step 2); rank 1 never arrived: "
         "last completed 'recycle' #0 (step 1), finished its steps"},
        {"ranks", json::array()}}},
      {"samples",
       {{"repetitions", 1},
        {"warmup", 0},
        {"metrics",
         {{"fresh_bind", {{"unit", "s"}, {"per_repetition", {{0.0003, 0.007}}}}},
          {"reused_bind", {{"unit", "s"}, {"per_repetition", {{0.00001}}}}}}}}},
      {"environment",
       {{"hmc_version", "0.1.0"},
        {"torch_version", "1.13.0"},
        {"transport", "threads"},
        {"host", "node-a"},
        {"world_size", 2},
        {"wall_seconds", 2.04},
        {"command", {"hmc-run", "x.json"}}}}};
}

json leakTrends() {
  json values = json::array();
  for (int c = 0; c < 200; ++c) values.push_back(12 + 0.1 * c);
  return {{"cycles", 200},
          {"warmup", 20},
          {"confidence", 0.99},
          {"series",
           {{{"rank", nullptr},
             {"host", "h1"},
             {"metric", "open_descriptors"},
             {"title", "open descriptors"},
             {"unit", "count"},
             {"cycle_stride", 1},
             {"values", json::array({3, 3, 3})},
             {"slope_per_cycle", 0.0},
             {"ci_low", -0.01},
             {"ci_high", 0.01},
             {"intercept", 3.0},
             {"threshold_per_cycle", 0.05},
             {"verdict", "flat"},
             {"text", "process: open descriptors flat"}},
            {{"rank", 2},
             {"host", "h1"},
             {"metric", "open_descriptors"},
             {"title", "open descriptors"},
             {"unit", "count"},
             {"cycle_stride", 1},
             {"values", values},
             {"slope_per_cycle", 0.1},
             {"ci_low", 0.08},
             {"ci_high", 0.12},
             {"intercept", 12.0},
             {"threshold_per_cycle", 0.05},
             {"verdict", "leak"},
             {"text",
              "rank 2: open descriptors grow 0.10 per cycle (99% CI 0.08-0.12) over 200 "
              "cycles: leak"}}}},
          {"leaks",
           {"rank 2: open descriptors grow 0.10 per cycle (99% CI 0.08-0.12) over 200 "
            "cycles: leak"}}};
}

json compareDocument() {
  auto metric = [](const char* name, const char* verdict, bool regression, double change) {
    return json{
        {"name", name},
        {"unit", "s"},
        {"baseline",
         {{"samples", 5}, {"median", 0.001}, {"values", {0.001, 0.0011, 0.0009, 0.001, 0.001}}}},
        {"current",
         {{"samples", 5},
          {"median", 0.001 * (1 + change)},
          {"values", {0.0013, 0.0013, 0.0012, 0.0014, 0.0013}}}},
        {"change", change},
        {"p_value", 0.0079},
        {"exact", true},
        {"verdict", verdict},
        {"regression", regression}};
  };
  return {{"format", "hmc-compare/1"},
          {"baseline", {{"file", "base.json"}, {"kind", "hmc-run report"}}},
          {"current", {{"file", "new.json"}, {"kind", "hmc-run report"}}},
          {"alpha", 0.05},
          {"max_regression", 0.1},
          {"metrics",
           {metric("quickstart: repeat/cycle", "slower", true, 0.3),
            metric("quickstart: fresh|bind <x>", "same", false, 0.01)}},
          {"only_baseline", json::array()},
          {"only_current", json::array()},
          {"geometric_mean_ratio", 1.14},
          {"regressions", {"quickstart: repeat/cycle"}},
          {"undecided", json::array()},
          {"exit_code", 1}};
}

// The diagnosis of a manifest mismatch in a world of 4 (lib/include/hmc/diagnostics/
// diagnosis.hpp): rank 2's manifest differs from rank 0's at 'close validation' #26, step 3;
// rank 3's later error follows from it.
json mismatchReport() {
  json report = hangReport();
  report["scenario"] = "divergent-manifest";
  report["outcome"] = "fail";
  report["world_size"] = 4;
  report["hang"] = nullptr;
  report["ranks"] = json::array();
  for (int r = 0; r < 4; ++r) {
    json close = step(3, "close_all", "error", false);
    close["error"] = {{"kind", "runtime_error"},
                      {"message", "multicore resource manifests differ across ranks"}};
    json forward = step(4, "forward", r == 3 ? "error" : "not_run", r != 3);
    report["ranks"].push_back({{"rank", r},
                               {"host", "h" + std::to_string(r)},
                               {"pid", 100 + r},
                               {"steps",
                                {step(0, "create", "ok"), step(1, "forward", "ok"),
                                 step(2, "forward", "ok"), close, forward}}});
  }
  report["leaks"]["ranks"][0]["rank"] = 2;
  const std::string line =
      "manifest mismatch in 'close validation' #26 (step 3): rank 2 differs from rank 0 at "
      "manifest entry 0: rank 0 has [0,[\"scratch_linear\",16384]], rank 2 has "
      "[0,[\"scratch_linear\",4096]]";
  report["first_failure"] = {{"kind", "manifest_mismatch"},
                             {"stage", "close validation"},
                             {"sequence", 26},
                             {"step", 3},
                             {"ranks", {2}},
                             {"hosts", {"h2"}},
                             {"seen_by", {0, 1, 2}},
                             {"line", line},
                             {"detail", {{"index", 0}, {"rank", 2}, {"reference_rank", 0}}}};
  report["consequences"] = {
      {{"rank", 3},
       {"line",
        "rank 3 (h3): error in forward (step 4): no group bound (follows from the first failure)"},
       {"follows_from", "first_failure"}}};
  return report;
}

// The page after its style sheet (which names every class).
std::string bodyOf(const std::string& page) { return page.substr(page.find("</style>")); }

// The class of the timeline label that reads `text` ("rank 2 \u00b7 h2"), or "(none)".
std::string labelClass(const std::string& page, const std::string& text) {
  const auto at = page.find(">" + text + "</text>");
  if (at == std::string::npos) return "(none)";
  const auto open = page.rfind("<text class=\"", at);
  if (open == std::string::npos) return "(none)";
  const auto from = open + 13;
  return page.substr(from, page.find('"', from) - from);
}

}  // namespace

TEST_SUITE("render") {
  TEST_CASE("escapeHtml escapes markup, quotes and control characters") {
    CHECK(escapeHtml("<a href=\"x\">Tom & 'Jerry'</a>") ==
          "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;");
    CHECK(escapeHtml(std::string("a\x1b[31mb", 7)) == "a\\x1b[31mb");
    CHECK(escapeHtml("line\nnext") == "line\nnext");
    CHECK(escapeHtml("\xff") == "\\xff");
  }

  TEST_CASE("a report's page escapes every string from the document") {
    json report = hangReport();
    report["scenario"] = "<script>alert(1)</script>";
    report["ranks"][0]["steps"][2]["error"]["message"] = "<img src=x onerror=alert(2)>";
    report["ranks"][0]["host"] = "\"><b>host</b>";
    const std::string page = renderHtmlReport(report);
    CHECK(page.find("<script>alert(1)") == std::string::npos);
    CHECK(page.find("&lt;script&gt;alert(1)&lt;/script&gt;") != std::string::npos);
    CHECK(page.find("<img") == std::string::npos);
    CHECK(page.find("<b>host") == std::string::npos);
    // The only scripts: the error probe.
    CHECK(count(page, "<script") == 1);
  }

  TEST_CASE("a hang's page names the stage, the waiting and the missing ranks first") {
    const std::string page = renderHtmlReport(hangReport());
    const auto hang = page.find("id=\"hang\"");
    REQUIRE(hang != std::string::npos);
    CHECK(hang < page.find("r0-timeline"));  // before the timeline
    CHECK(page.find("Hang in &#39;close validation&#39; #1, step 2") != std::string::npos);
    CHECK(page.find("Missing: rank 1</strong>") != std::string::npos);
    CHECK(page.find("Waiting: rank 0") != std::string::npos);
    CHECK(page.find("rank 1 never arrived at this step") != std::string::npos);
    CHECK(page.find("stroke-dasharray=\"6 4\"") != std::string::npos);      // the hung column
    CHECK(page.find("missing rank (never arrived)") != std::string::npos);  // in the legend
  }

  TEST_CASE("a report's page has every section: timeline, bind times, leaks, environment") {
    const std::string page = renderHtmlReport(hangReport());
    CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
    for (const char* id : {"r0-timeline", "r0-timings", "r0-binds", "r0-leaks", "r0-environment"}) {
      CAPTURE(id);
      CHECK(page.find(std::string("id=\"") + id + "\"") != std::string::npos);
    }
    CHECK(count(page, "class=\"cell s-") == 8);  // 2 ranks x 4 steps
    CHECK(page.find("fresh bind") != std::string::npos);
    CHECK(page.find("reused bind") != std::string::npos);
    CHECK(page.find("<code>node-b</code>") != std::string::npos);  // hosts per rank
    CHECK(page.find("LibTorch") != std::string::npos);
    // Self-contained: nothing to fetch.
    CHECK(page.find("src=") == std::string::npos);
    CHECK(page.find("<link") == std::string::npos);
    CHECK(page.find("@import") == std::string::npos);
    // No leak trends in an old report.
    CHECK(page.find("Leak trends") == std::string::npos);
  }

  TEST_CASE("leak trends are drawn leaks first with the fitted line and the band") {
    json report = hangReport();
    report["leak_trends"] = leakTrends();
    const std::string page = renderHtmlReport(report);
    CHECK(page.find("id=\"r0-leak-trends\"") != std::string::npos);
    CHECK(count(page, "class=\"plot trend") == 2);
    CHECK(page.find("plot trend t-leak") < page.find("plot trend t-flat"));
    CHECK(count(page, "class=\"fit\"") == 2);
    CHECK(count(page, "class=\"band\"") == 2);
    CHECK(page.find(
              "open descriptors grow 0.10 per cycle (99% CI 0.08-0.12) over 200 cycles: leak") !=
          std::string::npos);
    CHECK(page.find("warm-up") != std::string::npos);
    // Read first: the leak, above the timeline, linking to the plots.
    const auto summary = page.find("id=\"r0-leak-summary\"");
    REQUIRE(summary != std::string::npos);
    CHECK(summary < page.find("r0-timeline"));
    CHECK(page.find("Leak: 1 series grows over the cycles") != std::string::npos);
  }

  TEST_CASE("a rank that crashed after some steps is marked where it stopped") {
    json report = hangReport();
    report["ranks"][1]["crashed"] = true;
    report["ranks"][1]["crash_reason"] = "fault crash at step 1";
    report["ranks"][1]["steps"][2]["status"] = "not_run";
    report["ranks"][1]["steps"][3]["status"] = "not_run";
    const std::string page = renderHtmlReport(report);
    CHECK(count(page, "class=\"crash-mark\"") == 1);
    CHECK(page.find("rank 1 crashed here: fault crash at step 1") != std::string::npos);
  }

  TEST_CASE("a crashed rank without steps is drawn as no result, with its reason") {
    json report = hangReport();
    report["outcome"] = "fail";
    report["hang"] = nullptr;
    report["ranks"][1] = {{"rank", 1},
                          {"host", "node-b"},
                          {"pid", nullptr},
                          {"crashed", true},
                          {"crash_reason", "exited with status 17 (fault crash)"}};
    const std::string page = renderHtmlReport(report);
    CHECK(page.find("id=\"crash\"") != std::string::npos);
    CHECK(page.find("1 rank crashed") != std::string::npos);
    CHECK(page.find("exited with status 17 (fault crash)") != std::string::npos);
    CHECK(page.find("url(#r0-dead)") != std::string::npos);
    // The legend names what was drawn, and only that.
    CHECK(page.find("no result (the rank process died)") != std::string::npos);
    CHECK(page.find("missing rank (never arrived)") == std::string::npos);
    }

  TEST_CASE("a failed report lists its unexpected steps with their errors first") {
    json report = hangReport();
    report["outcome"] = "fail";
    report["hang"] = nullptr;
    json& check = report["ranks"][1]["steps"][3];
    check["status"] = "error";
    check["expected"] = false;
    check["error"] = {{"kind", "check_failed"}, {"message", "groups: expected 1, got 2"}};
    report["ranks"][0]["steps"][2] = step(2, "close_all", "ok");
    const std::string page = renderHtmlReport(report);
    const auto box = page.find("id=\"r0-unexpected\"");
    REQUIRE(box != std::string::npos);
    CHECK(box < page.find("r0-timeline"));
    CHECK(page.find("1 step did not meet its expectation") != std::string::npos);
    CHECK(page.find("rank 1 step 3 check a: error (check_failed): groups: expected 1, got 2") !=
          std::string::npos);
  }

  TEST_CASE("an invalid report says what is wrong and draws nothing else") {
    const json report = {
        {"format", "hmc-report/1"},
        {"scenario", nullptr},
        {"world_size", nullptr},
        {"outcome", "invalid"},
        {"ranks", json::array()},
        {"error", {{"file", "bad.json"}, {"path", "/steps/1"}, {"message", "expected an op"}}}};
    const std::string page = renderHtmlReport(report);
    CHECK(page.find("id=\"invalid\"") != std::string::npos);
    CHECK(page.find("expected an op") != std::string::npos);
    CHECK(page.find("-timeline") == std::string::npos);
  }

  TEST_CASE("a report set has one section per report and a table of outcomes") {
    json pass = hangReport();
    pass["scenario"] = "quickstart";
    pass["outcome"] = "pass";
    pass["hang"] = nullptr;
    const json set = {{"format", "hmc-report-set/1"}, {"reports", {pass, hangReport()}}};
    const std::string page = renderHtmlReport(set);
    CHECK(page.find("id=\"r0\"") != std::string::npos);
    CHECK(page.find("id=\"r1\"") != std::string::npos);
    CHECK(page.find("<h1>hmc-run: 2 scenarios<span class=\"badge b-hang\">") != std::string::npos);
    CHECK(page.find("href=\"#r1\"") != std::string::npos);
  }

  TEST_CASE("a huge run's page is bounded and says what was left out") {
    // 1,024 ranks of 300 steps: 16 times the ranks a page draws and 1.5 times the steps, with
    // the problem far from either end of both. (1,000 steps a rank made 1.8 GB of json and
    // took 30-60 s under AddressSanitizer, for the same checks.)
    json report = hangReport();
    json ranks = json::array();
    json steps = json::array();
    for (int s = 0; s < 300; ++s) steps.push_back(step(s, "forward", "ok"));
    for (int r = 0; r < 1024; ++r)
      ranks.push_back({{"rank", r}, {"host", "h"}, {"pid", 1000 + r}, {"steps", steps}});
    ranks[900]["steps"][150]["status"] = "error";
    ranks[900]["steps"][150]["expected"] = false;
    report["ranks"] = ranks;
    report["hang"] = nullptr;
    json values = json::array();
    for (int i = 0; i < 100000; ++i) values.push_back(1e-4 + 1e-9 * i);
    report["samples"]["metrics"]["fresh_bind"]["per_repetition"] = {values};
    const std::string page = renderHtmlReport(report);
    CHECK(count(page, "class=\"cell s-") == kMaxTimelineRanks * kMaxTimelineSteps);
    CHECK(page.find("64 of 1024 ranks drawn") != std::string::npos);
    CHECK(page.find("steps 50-249 of 300 drawn") != std::string::npos);  // around the error
    CHECK(page.find(">rank 900<") != std::string::npos);                   // the rank with it
    CHECK(page.find("2000 dots drawn") != std::string::npos);
    CHECK(page.size() < 8u * 1024 * 1024);
  }

  TEST_CASE("a hang diagnosis that names every rank of a big world is cut, saying so") {
    json report = hangReport();
    std::string diagnosis = "rank 0 waits in 'close validation' #1 (step 2)";
    for (int r = 1; r < 4096; ++r) {
      diagnosis += "; rank " + std::to_string(r) +
                   " never arrived: last completed 'recycle' #0 (step 1), finished its steps";
    }
    report["hang"]["diagnosis"] = diagnosis;
    const std::string page = renderHtmlReport(report);
    CHECK(page.find("more characters in the JSON report") != std::string::npos);
    CHECK(page.find("rank 4095 never arrived") == std::string::npos);
    CHECK(page.find("Missing: ranks 1-4095</strong>") != std::string::npos);
    CHECK(page.size() < 8u * 1024 * 1024);
  }

  TEST_CASE("renderers refuse a document of another format") {
    CHECK_THROWS_AS(renderHtmlReport(json{{"format", "hmc-compare/1"}}), hmc::ValueError);
    CHECK_THROWS_AS(renderHtmlCompare(json{{"format", "hmc-report/1"}}), hmc::ValueError);
    CHECK_THROWS_AS(renderMarkdownCompare(json::array()), hmc::ValueError);
  }

  TEST_CASE("a comparison's page draws each metric with its verdict, regressions first") {
    const std::string page = renderHtmlCompare(compareDocument());
    CHECK(page.find("data-verdict=\"FAILED\"") != std::string::npos);
    CHECK(
        page.find("1 metric slower by more than 10% with p &lt; 0.05: quickstart: repeat/cycle") !=
        std::string::npos);
    CHECK(count(page, "class=\"plot metric") == 2);
    CHECK(page.find("plot metric v-slower") < page.find("plot metric v-same"));
    CHECK(page.find("fresh|bind &lt;x&gt;") != std::string::npos);
    CHECK(count(page, "<circle") == 20);  // 5 + 5 samples per metric
    // The gate (baseline median + 10%) on each axis.
    CHECK(count(page, "class=\"gate\"") == 2);
    CHECK(page.find("a candidate median above 1.10 ms (+10%) fails") != std::string::npos);
    CHECK(page.find("+30.0%") != std::string::npos);
  }

  TEST_CASE("the Markdown table has a row per metric and the overall verdict") {
    const std::string md = renderMarkdownCompare(compareDocument());
    CHECK(md.find("### hmc-run compare: FAILED\n") == 0);
    CHECK(md.find("| metric | baseline | candidate | change | interval | p | verdict |\n") !=
          std::string::npos);
    CHECK(md.find("| quickstart: repeat/cycle | 1.00 ms | 1.30 ms | +30.0% | n/a | 0.0079 | "
                  "**slower (regression)** |") != std::string::npos);
    // A pipe or markup in a name cannot break the table.
    CHECK(md.find("| quickstart: fresh\\|bind &lt;x&gt; |") != std::string::npos);
    CHECK(md.find("\n**FAILED**: 1 metric slower by more than 10% with p < 0.05: quickstart: "
                  "repeat/cycle\n") == std::string::npos);  // '<' is an entity in Markdown
    CHECK(md.find("\n**FAILED**: 1 metric slower by more than 10% with p &lt; 0.05: quickstart: "
                  "repeat/cycle\n") != std::string::npos);
    json ok = compareDocument();
    ok["regressions"] = json::array();
    ok["metrics"][0]["regression"] = false;
    CHECK(renderMarkdownCompare(ok).find("**OK**: no metric slower by more than 10% with p &lt; "
                                         "0.05 (2 compared)") != std::string::npos);
  }

  TEST_CASE("a program's world end is drawn: the verdict, every rank's end and leaks") {
    const json clean = {{"format", "hmc-world-end/1"},
                        {"name", "train"},
                        {"world_size", 2},
                        {"launcher", "torchrun"},
                        {"transport", "tcp"},
                        {"timeout_s", 30},
                        {"store", "h1:29500"},
                        {"outcome", "pass"},
                        {"exit_code", 0},
                        {"ranks",
                         {{{"rank", 0}, {"host", "h1"}, {"pid", 11}, {"status", "ok"},
                           {"error", ""}, {"stage", ""}, {"sequence", 0},
                           {"leaks", {{"checked", true}, {"groups_left", 0},
                                      {"bound_groups_left", 0}}}},
                          {{"rank", 1}, {"host", "h2"}, {"pid", 12}, {"status", "error"},
                           {"error", "<b>manifest</b>"}, {"stage", "close validation"},
                           {"sequence", 7},
                           {"leaks", {{"checked", true}, {"groups_left", 2},
                                      {"bound_groups_left", 1}}}}}}};
    const std::string page = hmc::render::renderHtmlWorldEnd(clean);
    CHECK(page.find("Every rank ended cleanly") != std::string::npos);
    CHECK(page.find("<td>h2:12</td><td><strong>error</strong></td>") != std::string::npos);
    CHECK(page.find("&lt;b&gt;manifest&lt;/b&gt;") != std::string::npos);  // escaped
    CHECK(page.find("2 groups left open (1 bound)") != std::string::npos);
    CHECK(page.find("<td>none</td>") != std::string::npos);
    CHECK_THROWS_AS(hmc::render::renderHtmlWorldEnd(json{{"format", "hmc-report/1"}}),
                    hmc::ValueError);
  }
  TEST_CASE("a recording's ranks side by side: the first divergence marked, odd cells bold") {
    const json diverged = {
        {"format", "hmc-record-show/1"},
        {"directory", "rec<1>"},
        {"ranks",
         {{{"rank", 0}, {"host", "h1"}, {"pid", 10}, {"version", "0.1"}, {"events", 3},
           {"ended", true}, {"stop", ""}},
          {{"rank", 1}, {"host", "h2"}, {"pid", 11}, {"version", "0.1"}, {"events", 2},
           {"ended", false}, {"stop", "torn record at offset 90"}},
          {{"rank", 2}, {"host", "h2"}, {"pid", 12}, {"version", "0.1"}, {"events", 3},
           {"ended", true}, {"stop", ""}}}},
        {"total_rows", 3},
        {"rows",
         {{{"event", 0}, {"cells", {"create a", "create a", "create a"}}},
          {{"event", 1}, {"cells", {"close a", "<skip>", "close a"}}},
          {{"event", 2}, {"cells", {"close_all", "", "close_all"}}}}},
        {"divergence", 1}};
    const std::string page = renderHtmlRecordShow(diverged);
    CHECK(page.find("data-divergence=\"1\"") != std::string::npos);
    CHECK(page.find("The ranks first differ at event 1") != std::string::npos);
    CHECK(page.find("<tr id=\"event-1\" class=\"diverge\"") != std::string::npos);
    CHECK(count(page, "class=\"diverge\"") == 1);
    // Rank 1's cell differs from the other two in row 1 and row 2; escaped.
    CHECK(page.find("<strong>&lt;skip&gt;</strong>") != std::string::npos);
    CHECK(page.find("<skip>") == std::string::npos);
    CHECK(page.find("rec&lt;1&gt;") != std::string::npos);
    CHECK(count(page, "<strong>close_all</strong>") == 0);  // the majority is not marked
    CHECK(page.find("torn record at offset 90") != std::string::npos);
    json same = diverged;
    same["divergence"] = nullptr;
    same["rows"] = json::array({{{"event", 0}, {"cells", {"create a", "create a", "create a"}}}});
    same["total_rows"] = 2;
    const std::string samePage = renderHtmlRecordShow(same);
    CHECK(samePage.find("Every rank recorded the same events") != std::string::npos);
    CHECK(samePage.find("class=\"diverge\"") == std::string::npos);
    CHECK(samePage.find("1 of 2 rows drawn") != std::string::npos);
    CHECK_THROWS_AS(renderHtmlRecordShow(json{{"format", "hmc-report/1"}}), hmc::ValueError);
  }
  TEST_CASE("a recording's page folds the rows every rank repeats and opens at the divergence") {
    // 131 rows over 3 ranks: rows 0-120 the same on every rank (folded), 121-123 context, rank
    // 1 differs at row 124.
    json rows = json::array();
    for (int i = 0; i < 131; ++i) {
      const std::string text = i < 124 ? "barrier " + std::to_string(i) : std::string("close_all");
      rows.push_back({{"event", i}, {"cells", {text, i == 124 ? "close a: hang" : text, text}}});
    }
    json shown = {
        {"format", "hmc-record-show/1"},
        {"directory", "rec"},
        {"ranks",
         {{{"rank", 0}, {"host", "h"}, {"pid", 1}, {"version", "0.1"}, {"events", 131},
           {"ended", true}, {"stop", ""}},
          {{"rank", 1}, {"host", "h"}, {"pid", 2}, {"version", "0.1"}, {"events", 131},
           {"ended", true}, {"stop", ""}},
          {{"rank", 2}, {"host", "h"}, {"pid", 3}, {"version", "0.1"}, {"events", 131},
           {"ended", true}, {"stop", ""}}}},
        {"total_rows", 131},
        {"rows", rows},
        {"divergence", 124},
        {"first_divergence",
         {{"event", 124},
          {"ranks", {1}},
          {"agreeing_ranks", {0, 2}},
          {"usual", "close_all"},
          {"summary", "rank 1 has 'close a: hang' where ranks 0, 2 have 'close_all'"}}},
        {"first_failure", nullptr},
        {"folds",
         {{{"first", 0},
           {"last", 120},
           {"events", 121},
           {"calls", {{{"op", "barrier"}, {"count", 121}}}},
           {"summary", "events 0-120: every rank the same (121 events: 121 barrier)"}}}}};
    const std::string page = renderHtmlRecordShow(shown);
    // The top names the row and the rank before any table.
    const auto verdict = page.find("The ranks first differ at event 124");
    REQUIRE(verdict != std::string::npos);
    CHECK(page.find("rank 1 has &#39;close a: hang&#39; where ranks 0, 2 have") > verdict);
    CHECK(verdict < page.find("<table"));
    // One fold, collapsed, holding rows 0-120 with one text each; the rest drawn in full.
    CHECK(count(page, "<details>") == 1);
    CHECK(page.find("<details open") == std::string::npos);
    CHECK(page.find("<summary>events 0-120: every rank the same (121 events: 121 barrier)"
                    "</summary>") != std::string::npos);
    const auto foldStart = page.find("<details>");
    const auto foldEnd = page.find("</details>");
    const std::string folded = page.substr(foldStart, foldEnd - foldStart);
    CHECK(count(folded, "<tr id=\"event-") == 121);
    CHECK(folded.find("<tr id=\"event-120\">") != std::string::npos);
    CHECK(folded.find("<tr id=\"event-121\"") == std::string::npos);
    CHECK(count(folded, "barrier 7<") == 1);  // once, not once per rank
    CHECK(page.find("<tr id=\"event-121\"><td class=\"num\">121</td>") > foldEnd);
    CHECK(page.find("<tr id=\"event-124\" class=\"diverge\"") > foldEnd);
    CHECK(count(page, "class=\"diverge\"") == 1);
    // It opens there: a script scrolls to row 124 when the first screen does not show it.
    CHECK(page.find("getElementById('event-124')") != std::string::npos);
    CHECK(page.find("window.scrollBy(0,b-window.innerHeight*0.75)") != std::string::npos);
    // Every row drawn (folded ones inside the fold): no "N of M rows drawn".
    CHECK(page.find("rows drawn") == std::string::npos);

    // --all: no folds in the document, every row a full row.
    shown["folds"] = json::array();
    const std::string all = renderHtmlRecordShow(shown);
    CHECK(all.find("<details>") == std::string::npos);
    CHECK(count(all, "<tr id=\"event-") == 131);
    CHECK(all.find("<tr id=\"event-0\"><td class=\"num\">0</td><td class=\"mono\">barrier 0"
                   "</td><td class=\"mono\">barrier 0</td>") != std::string::npos);

    // A call every rank failed alike, no divergence: named first, and the page opens there.
    shown["divergence"] = nullptr;
    shown["first_divergence"] = nullptr;
    shown["first_failure"] = {{"event", 124},
                              {"ranks", {0, 1, 2}},
                              {"summary", "every rank has 'close a: hang'"}};
    const std::string failed = renderHtmlRecordShow(shown);
    CHECK(failed.find("Every rank failed the same call at event 124") != std::string::npos);
    CHECK(failed.find("Every rank recorded the same events") == std::string::npos);
    CHECK(failed.find("<tr id=\"event-124\" class=\"failed\"") != std::string::npos);
    CHECK(failed.find("getElementById('event-124')") != std::string::npos);
  }

  TEST_CASE("a manifest mismatch is read first: the line, the kind, rank 2 and its host") {
    const std::string page = renderHtmlReport(mismatchReport());
    const auto block = page.find("id=\"r0-first-failure\"");
    REQUIRE(block != std::string::npos);
    // Before every other box, the timeline and the tables.
    CHECK(block < page.find("id=\"r0-unexpected\""));
    CHECK(block < page.find("id=\"r0-steps\""));
    CHECK(block < page.find("<table class=\"leaks\""));
    CHECK(page.find("class=\"callout first-failure fail\"") != std::string::npos);
    CHECK(page.find("data-kind=\"manifest_mismatch\" data-ranks=\"2\"") != std::string::npos);
    CHECK(page.find("First failure: manifest mismatch</strong>") > block);
    CHECK(page.find("<p class=\"ff-line\">manifest mismatch in &#39;close validation&#39; #26 "
                    "(step 3): rank 2 differs from rank 0") > block);
    CHECK(page.find("<th>where</th><td>&#39;close validation&#39; #26, step 3</td>") !=
          std::string::npos);
    CHECK(page.find("<th>named ranks</th><td><strong>rank 2</strong> <span class=\"tag "
                    "part-cause\">the first failure</span>") != std::string::npos);
    CHECK(page.find("<th>host</th><td><code>h2</code></td>") != std::string::npos);
    CHECK(page.find("<th>seen by</th><td>ranks 0-2</td>") != std::string::npos);
    CHECK(page.find("<summary>detail</summary>") != std::string::npos);
    // What followed: rank 3, labelled once, after the block and before the timeline.
    const auto followed = page.find("id=\"r0-what-followed\"");
    REQUIRE(followed != std::string::npos);
    CHECK(block < followed);
    CHECK(followed < page.find("id=\"r0-steps\""));
    CHECK(page.find("<li data-rank=\"3\"><span class=\"tag part-follows\">follows from the "
                    "first failure</span> <span class=\"mono\">rank 3 (h3): error in forward "
                    "(step 4): no group bound</span></li>") != std::string::npos);
    // The rows: rank 2 the cause, rank 3 follows, ranks 0 and 1 saw it.
    CHECK(labelClass(page, "rank 2 \u00b7 h2") == "rank-label part-cause");
    CHECK(labelClass(page, "rank 3 \u00b7 h3") == "rank-label part-follows");
    CHECK(labelClass(page, "rank 0 \u00b7 h0") == "rank-label part-saw");
    CHECK(labelClass(page, "rank 1 \u00b7 h1") == "rank-label part-saw");
    CHECK(count(page, "<rect class=\"part part-cause\"") == 1);
    CHECK(count(page, "<rect class=\"part part-follows\"") == 1);
    CHECK(page.find("<title>rank 2: the first failure</title>") != std::string::npos);
    CHECK(page.find("<title>rank 3: follows from the first failure</title>") != std::string::npos);
    CHECK(page.find("the first failure (the rank it names)</span>") != std::string::npos);
    // The leaks table's row of rank 2.
    CHECK(page.find("<td><span class=\"tag part-cause\">the first failure</span> this rank "
                    "hung") != std::string::npos);
  }

  TEST_CASE("a hang naming rank 1 is read first, before the hang box, rank 1 marked") {
    json report = hangReport();
    report["first_failure"] = {
        {"kind", "hang"},
        {"stage", "close validation"},
        {"sequence", 1},
        {"step", 2},
        {"ranks", {1}},
        {"hosts", {"node-b"}},
        {"seen_by", {0}},
        {"line",
         "hang in 'close validation' #1 (step 2): rank 0 waited there; rank 1 never arrived"},
        {"detail", nullptr}};
    report["consequences"] = json::array();
    const std::string page = renderHtmlReport(report);
    const auto block = page.find("id=\"r0-first-failure\"");
    REQUIRE(block != std::string::npos);
    CHECK(block < page.find("id=\"hang\""));
    CHECK(block < page.find("r0-timeline"));
    CHECK(page.find("class=\"callout first-failure hang\"") != std::string::npos);
    CHECK(page.find("data-ranks=\"1\"") != std::string::npos);
    CHECK(page.find("<th>named ranks</th><td><strong>rank 1</strong>") != std::string::npos);
    CHECK(page.find("<th>host</th><td><code>node-b</code></td>") != std::string::npos);
    // Nothing followed; no detail to show.
    CHECK(page.find("r0-what-followed") == std::string::npos);
    CHECK(page.find("<summary>detail</summary>") == std::string::npos);
    CHECK(labelClass(page, "rank 1 \u00b7 node-b") == "rank-label part-cause");
    CHECK(labelClass(page, "rank 0 \u00b7 node-a") == "rank-label part-saw");
    // The row's note: its part first, then the hang diagnosis's words on it.
    CHECK(page.find("<title>the first failure: never arrived: last completed") !=
          std::string::npos);
    CHECK(page.find("<title>saw the first failure: waits in") != std::string::npos);
  }

  TEST_CASE("a report without a first failure has no block: an older hmc's, and a pass") {
    const std::string old = bodyOf(renderHtmlReport(hangReport()));
    CHECK(old.find("first-failure") == std::string::npos);
    CHECK(old.find("part-") == std::string::npos);
    CHECK(old.find("id=\"hang\"") != std::string::npos);  // drawn as before
    json pass = hangReport();
    pass["outcome"] = "pass";
    pass["hang"] = nullptr;
    pass["first_failure"] = nullptr;
    pass["consequences"] = json::array();
    const std::string page = bodyOf(renderHtmlReport(pass));
    CHECK(page.find("first-failure") == std::string::npos);
    CHECK(page.find("What followed") == std::string::npos);
    CHECK(page.find("part-") == std::string::npos);
  }

  TEST_CASE("the first failure's block escapes every string from the document") {
    json report = mismatchReport();
    report["first_failure"]["line"] = "<img src=x onerror=alert(1)>";
    report["first_failure"]["hosts"] = {"<b>h2</b>"};
    report["first_failure"]["kind"] = "\"><script>alert(2)</script>";
    report["first_failure"]["stage"] = "<i>stage</i>";
    report["first_failure"]["detail"] = {{"<k>", "</pre><script>alert(3)</script>"}};
    report["consequences"][0]["line"] = "<u>rank 3</u>";
    const std::string page = renderHtmlReport(report);
    CHECK(page.find("<img") == std::string::npos);
    CHECK(page.find("<b>h2") == std::string::npos);
    CHECK(page.find("<i>stage") == std::string::npos);
    CHECK(page.find("<u>rank 3") == std::string::npos);
    CHECK(page.find("&lt;img src=x onerror=alert(1)&gt;") != std::string::npos);
    CHECK(count(page, "<script") == 1);  // the error probe alone
  }

  TEST_CASE("a report set's table names each scenario's first failure") {
    json pass = hangReport();
    pass["scenario"] = "quickstart";
    pass["outcome"] = "pass";
    pass["hang"] = nullptr;
    const json set = {{"format", "hmc-report-set/1"}, {"reports", {pass, mismatchReport()}}};
    const std::string page = renderHtmlReport(set);
    const auto toc = page.find("<nav class=\"toc\">");
    const auto line = page.find("manifest mismatch in &#39;close validation&#39; #26");
    REQUIRE(line != std::string::npos);
    CHECK(toc < line);
    CHECK(line < page.find("</nav>"));
    CHECK(page.find("id=\"r1-first-failure\"") != std::string::npos);
    CHECK(page.find("id=\"r0-first-failure\"") == std::string::npos);
  }

  TEST_CASE("a world end leads with its first failure, then the ranks, each with its part") {
    const json world = {
        {"format", "hmc-world-end/1"},
        {"name", "hmc-train-loop"},
        {"world_size", 3},
        {"launcher", "mpirun"},
        {"transport", "tcp"},
        {"timeout_s", 3},
        {"store", "127.0.0.1:29930"},
        {"outcome", "hang"},
        {"exit_code", 3},
        {"first_failure",
         {{"kind", "hang"},
          {"stage", "close validation"},
          {"sequence", 29},
          {"step", nullptr},
          {"ranks", {1}},
          {"hosts", {"vm"}},
          {"seen_by", {0}},
          {"line",
           "hang in 'close validation' #29: ranks [0] waited there; rank 1 never arrived (rank "
           "1: it had reached the world's end after 29 collectives, with 1 group(s) open)"},
          {"detail", nullptr}}},
        {"consequences",
         {{{"rank", 2},
           {"line", "rank 2 (vm): error in close: boom (follows from the first failure)"},
           {"follows_from", "first_failure"}}}},
        {"ranks",
         {{{"rank", 0},
           {"host", "vm"},
           {"pid", 11},
           {"status", "hang"},
           {"error", "timeout"},
           {"stage", "close validation"},
           {"sequence", 29},
           {"leaks", {{"checked", false}, {"reason", "not checked: the world hung"}}}},
          {{"rank", 1},
           {"host", "vm"},
           {"pid", 12},
           {"status", "ok"},
           {"error", ""},
           {"stage", ""},
           {"sequence", 0},
           {"leaks", {{"checked", false}, {"reason", "not checked: skipped"}}}},
          {{"rank", 2},
           {"host", "vm"},
           {"pid", 13},
           {"status", "error"},
           {"error", "boom"},
           {"stage", "close validation"},
           {"sequence", 29},
           {"leaks", {{"checked", false}, {"reason", "not checked: the world hung"}}}}}},
        {"status", {{"diagnosis", "rank 0 waits in 'close validation' #29 (step 0)"}}}};
    const std::string page = hmc::render::renderHtmlWorldEnd(world);
    const auto block = page.find("id=\"world-first-failure\"");
    REQUIRE(block != std::string::npos);
    CHECK(block < page.find("id=\"verdict\""));
    CHECK(block < page.find("id=\"ranks\""));
    CHECK(page.find("First failure: hang</strong>") > block);
    CHECK(page.find("<th>where</th><td>&#39;close validation&#39; #29</td>") != std::string::npos);
    CHECK(page.find("<th>named ranks</th><td><strong>rank 1</strong>") != std::string::npos);
    CHECK(page.find("<th>host</th><td><code>vm</code></td>") != std::string::npos);
    const auto followed = page.find("id=\"world-what-followed\"");
    REQUIRE(followed != std::string::npos);
    CHECK(followed < page.find("id=\"ranks\""));
    CHECK(page.find("<li data-rank=\"2\"><span class=\"tag part-follows\">") != std::string::npos);
    // The ranks' table: a column of each rank's part.
    CHECK(page.find("<tr><th>rank</th><th>first failure</th>") != std::string::npos);
    CHECK(page.find("<tr class=\"part-saw\"><td class=\"num\">0</td><td><span class=\"tag "
                    "part-saw\">saw the first failure</span></td>") != std::string::npos);
    CHECK(page.find("<tr class=\"part-cause\"><td class=\"num\">1</td><td><span class=\"tag "
                    "part-cause\">the first failure</span></td>") != std::string::npos);
    CHECK(page.find("<tr class=\"part-follows\"><td class=\"num\">2</td><td><span "
                    "class=\"tag part-follows\">follows from the first failure</span></td>") !=
          std::string::npos);
    // A world end of an older hmc: no block, no column.
    json old = world;
    old.erase("first_failure");
    old.erase("consequences");
    const std::string before = bodyOf(hmc::render::renderHtmlWorldEnd(old));
    CHECK(before.find("first-failure") == std::string::npos);
    CHECK(before.find("<th>first failure</th>") == std::string::npos);
    CHECK(before.find("<tr><th>rank</th><th>where</th>") != std::string::npos);
  }
}  // TEST_SUITE
