#pragma once
// `hmc-run render DOCUMENT.json --html PAGE.html`: draws a JSON document that hmc-run wrote
// earlier, perhaps on another machine: a report (hmc-report/1, hmc-report-set/1, from
// --report) or a comparison (hmc-compare/1, from `compare --json`), as the page that --html
// would have written (hmc/render/html.hpp). Needs no LibTorch.
//
// Exit codes: 0 written; 2 bad input (unreadable, not JSON, another format) or a page that
// cannot be written.

#include <CLI/CLI.hpp>
#include <string>

namespace hmc::app {

struct RenderOptions {
  std::string documentPath;
  std::string htmlPath;
};

// Registers the `render` subcommand on `app`; the options land in `options`.
CLI::App* addRenderCommand(CLI::App& app, RenderOptions& options);

// Writes the page; returns the exit code. Errors go to stderr.
int runRender(const RenderOptions& options);

}  // namespace hmc::app
