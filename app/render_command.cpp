#include "render_command.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hmc/error.hpp"
#include "hmc/render/html.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/text.hpp"

namespace hmc::app {
namespace {

constexpr int kExitBadInput = 2;

nlohmann::json readDocument(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ValueError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& error) {
    throw ValueError(fmt::format("{}: not valid JSON: {}", path, error.what()));
  }
}

}  // namespace

CLI::App* addRenderCommand(CLI::App& app, RenderOptions& options) {
  auto* sub = app.add_subcommand(
      "render",
      "Draw a JSON document hmc-run wrote (a --report file, or `compare --json` output) as one "
      "self-contained HTML page, e.g. a report copied from a cluster");
  sub->add_option("document", options.documentPath,
                  "hmc-report/1, hmc-report-set/1, hmc-compare/1, hmc-world-end/1 or "
                  "hmc-record-show/1 JSON")
      ->required();
  sub->add_option("--html", options.htmlPath, "Write the page here; - for standard output")
      ->required();
  return sub;
}

int runRender(const RenderOptions& options) {
  if (const std::string problem = scenario::checkOutputPath(options.htmlPath); !problem.empty()) {
    fmt::print(stderr, "hmc-run render: {}\n", problem);
    return kExitBadInput;
  }
  try {
    const nlohmann::json document = readDocument(options.documentPath);
    const std::string format =
        document.is_object() && document.contains("format") && document["format"].is_string()
            ? document["format"].get<std::string>()
            : "";
    std::string page;
    if (format == "hmc-compare/1") {
      page = render::renderHtmlCompare(document);
    } else if (format == "hmc-report/1" || format == "hmc-report-set/1") {
      page = render::renderHtmlReport(document);
    } else if (format == "hmc-world-end/1") {
      page = render::renderHtmlWorldEnd(document);
    } else if (format == "hmc-record-show/1") {
      page = render::renderHtmlRecordShow(document);
    } else {
      throw ValueError(fmt::format(
          "{}: unknown format '{}': expected hmc-report/1, hmc-report-set/1 (hmc-run --report), "
          "hmc-compare/1 (hmc-run compare --json), hmc-world-end/1 (a program's HMC_REPORT) or "
          "hmc-record-show/1 (hmc-run record show --json)",
          options.documentPath, hmc::printable(format)));
    }
    scenario::writeOutputFile(options.htmlPath, page);
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run render: {}\n", error.what());
    return kExitBadInput;
  }
  return 0;
}

}  // namespace hmc::app
