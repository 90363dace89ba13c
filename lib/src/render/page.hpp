#pragma once
// The parts every page of hmc/render/html.hpp shares: reading documents leniently, the page's
// frame (its style, the script-error probe), SVG coordinates, axes and bounded dot sets.

#include <cmath>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format.hpp"

namespace hmc::render::detail {

// escapeHtml.
std::string esc(std::string_view text);
// At most `limit` bytes of `text` (whole UTF-8 characters), saying how much was cut: texts from
// a report grow with the world (a hang diagnosis names every rank), the page must not.
std::string clip(const std::string& text, std::size_t limit);
// `*value`, or an empty object for nullptr.
const nlohmann::json& objectOf(const nlohmann::json* value);
// A boolean member that is true.
bool flag(const nlohmann::json& value, std::string_view key);
// A finite number member, truncated to an integer.
std::optional<long long> integerOf(const nlohmann::json& value, std::string_view key);
// An array member, else nullptr.
const nlohmann::json* arrayOf(const nlohmann::json& value, std::string_view key);
// SVG coordinates with one decimal.
std::string px(double value);

// <!DOCTYPE html> ... <main>, with the style, a Content-Security-Policy that forbids fetching
// anything, and the probe that records script errors on <html data-page-errors>.
void pageStart(std::string& out, const std::string& title);
// </main> ... </html>.
void pageEnd(std::string& out);
// A coloured pill: class b-<word>.
void badge(std::string& out, const std::string& word);

// About `count` round tick values covering [low, high].
std::vector<double> linearTicks(double low, double high, int count);
// A horizontal axis mapping [low, high] (log10 of it when `log`) onto [x0, x1].
struct Axis {
  double low = 0, high = 1, x0 = 0, x1 = 1;
  bool log = false;
  double operator()(double value) const {
    double v = value, lo = low, hi = high;
    if (log) {
      v = std::log10(std::max(value, 1e-12));
      lo = std::log10(low);
      hi = std::log10(high);
    }
    if (hi <= lo) return (x0 + x1) / 2;
    return x0 + (v - lo) / (hi - lo) * (x1 - x0);
  }
  // Round values to label: decades on a log axis (1-2-5 within each when it spans few).
  std::vector<double> ticks(int count) const;
};

// Evenly spaced picks of at most `limit` of `values` (the page stays bounded).
std::vector<double> thinned(const std::vector<double>& values, std::size_t limit);
// By nearest rank, as the report's `timings` are, so that the page and the table agree.
double quantile(std::vector<double> values, double q);
// A deterministic jitter in [-1, 1] for the i-th dot.
double jitter(std::size_t i);

}  // namespace hmc::render::detail
