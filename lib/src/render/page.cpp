#include "page.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hmc/render/html.hpp"
#include "hmc/text.hpp"

namespace hmc::render {

using nlohmann::json;

std::string escapeHtml(std::string_view raw) {
  // printable() escapes control characters and invalid UTF-8 but keeps newline and tab
  // visible as \n and \t; a page may keep them (pre-wrapped text), so they pass unescaped.
  std::string out;
  out.reserve(raw.size());
  std::size_t start = 0;
  auto flush = [&](std::size_t end) {
    const std::string safe = hmc::printable(raw.substr(start, end - start));
    for (const char c : safe) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&quot;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
  };
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\n' || raw[i] == '\t') {
      flush(i);
      out += raw[i];
      start = i + 1;
    }
  }
  flush(raw.size());
  return out;
}

namespace detail {

std::string esc(std::string_view text) { return escapeHtml(text); }

// At most `limit` bytes of `text` (whole UTF-8 characters), saying how much was cut: texts from
// a report grow with the world (a hang diagnosis names every rank), the page must not.
std::string clip(const std::string& text, std::size_t limit) {
  if (text.size() <= limit) return text;
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) +
         fmt::format("\u2026 ({} more characters in the JSON report)", text.size() - cut);
}

const json& emptyObject() {
  static const json empty = json::object();
  return empty;
}
const json& objectOf(const json* value) { return value != nullptr ? *value : emptyObject(); }

bool flag(const json& value, std::string_view key) {
  const json* member = child(value, key);
  return member != nullptr && member->is_boolean() && member->get<bool>();
}

std::optional<long long> integerOf(const json& value, std::string_view key) {
  const json* member = child(value, key);
  if (member == nullptr || !member->is_number()) return std::nullopt;
  const double number = member->get<double>();
  if (!std::isfinite(number)) return std::nullopt;
  return static_cast<long long>(number);
}

const json* arrayOf(const json& value, std::string_view key) {
  const json* member = child(value, key);
  return member != nullptr && member->is_array() ? member : nullptr;
}

// SVG coordinates with one decimal.
std::string px(double value) { return fmt::format("{:.1f}", value); }

constexpr const char* kStyle = R"css(
:root{--ink:#1b1f24;--muted:#57606a;--line:#d0d7de;--panel:#f6f8fa;--ok:#009E73;--error:#D55E00;
--hang:#CC79A7;--hangdark:#8E3B74;--warn:#E69F00;--blue:#0072B2}
*{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI","DejaVu Sans",Arial,sans-serif;color:var(--ink);margin:0;background:#fff}
main{max-width:1360px;margin:0 auto;padding:20px 32px 48px}
h1{font-size:26px;margin:0 0 2px}
h2{font-size:22px;margin:36px 0 8px;padding-bottom:4px;border-bottom:2px solid var(--line)}
h3{font-size:17px;margin:24px 0 6px}
p{margin:6px 0}
.sub{color:var(--muted);margin:0 0 10px}
.badge{display:inline-block;padding:1px 10px;border-radius:12px;font-size:13px;font-weight:600;color:#fff;vertical-align:3px;margin-left:6px}
.b-pass,.b-OK,.b-faster{background:var(--ok)}.b-fail,.b-FAILED,.b-slower{background:var(--error)}
.b-hang{background:var(--hangdark)}.b-invalid,.b-same{background:#6e7781}
.b-UNDECIDED,.b-undecided,.b-INCONCLUSIVE,.b-inconclusive,.b-leak{background:var(--warn);color:var(--ink)}.b-flat{background:var(--ok)}
.b-too_few_cycles{background:#6e7781}.b-regression{background:#8a1f00}
.callout{border-left:6px solid var(--line);padding:8px 14px;margin:12px 0;background:var(--panel);border-radius:4px}
.callout.hang{border-color:var(--hang)}.callout.crash,.callout.fail,.callout.FAILED{border-color:var(--error)}
.callout.leak,.callout.UNDECIDED,.callout.INCONCLUSIVE{border-color:var(--warn)}.callout.pass,.callout.OK{border-color:var(--ok)}
.callout.invalid{border-color:#6e7781}
.callout strong.head{display:block;font-size:16px}
table{border-collapse:collapse;font-size:14px;margin:6px 0 10px}
th,td{border:1px solid var(--line);padding:3px 9px;text-align:left;vertical-align:top}
th{background:var(--panel);font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:13px}
.legend{display:flex;flex-wrap:wrap;gap:6px 18px;font-size:13px;margin:6px 0 4px;color:var(--ink)}
.sw{display:inline-block;width:15px;height:15px;border:1px solid #0004;vertical-align:-3px;margin-right:6px;text-align:center;font-size:11px;line-height:13px}
.note{color:var(--muted);font-size:13px}
.scroll{overflow-x:auto}
svg{display:block;max-width:100%;height:auto;font-family:system-ui,"DejaVu Sans",Arial,sans-serif}
.plots{display:flex;flex-wrap:wrap;gap:14px}
.plot{border:1px solid var(--line);border-radius:6px;padding:8px 10px;background:#fff}
.plot h4{margin:0 0 4px;font-size:14px;font-weight:600;max-width:420px}
.plot.metric{width:420px}
nav.toc{font-size:14px}
.callout.first-failure{border-left-width:10px;background:#fdf0e9;padding:12px 16px;margin:14px 0 8px}
.callout.first-failure.hang{background:#f9edf4}.callout.first-failure.leak{background:#fdf5e6}
.callout.first-failure strong.head{font-size:19px}
.ff-line{font-size:16px;font-weight:600;margin:6px 0 8px;overflow-wrap:anywhere}
table.ff-facts{margin:0 0 4px}table.ff-facts th,table.ff-facts td{border:none;background:none;padding:1px 14px 1px 0}
table.ff-facts th{color:var(--muted)}
.callout.follows{border-color:#f3b08c}ul.follows{margin:4px 0;padding-left:20px}ul.follows li{margin:2px 0}
.tag{display:inline-block;padding:0 8px;border-radius:10px;font-size:12px;font-weight:600;white-space:nowrap;vertical-align:1px}
.tag.part-cause{background:var(--error);color:#fff}.tag.part-follows{background:#fff;color:#8a1f00;border:1px dashed var(--error)}
.tag.part-saw{background:#e4e7eb;color:var(--ink)}
tr.part-cause td{background:#fdf0e9}
)css";

// Records script errors into the page (a headless browser's --dump-dom shows them); the page
// itself needs no script.
constexpr const char* kErrorProbe =
    "<script>window.addEventListener('error',function(e){var d=document.documentElement;"
    "d.setAttribute('data-page-errors',(d.getAttribute('data-page-errors')||'')+e.message+"
    "';')});</script>";

void pageStart(std::string& out, const std::string& title) {
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out +=
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<title>" + esc(title) + "</title>\n<style>" + kStyle + "</style>\n";
  out += kErrorProbe;
  out += "\n</head>\n<body>\n<main>\n";
}

void pageEnd(std::string& out) {
  out +=
      "<p class=\"note\">Drawn by hmc-run from its JSON document: one file, nothing fetched "
      "when viewed.</p>\n</main>\n</body>\n</html>\n";
}

// About `count` round tick values covering [low, high].
std::vector<double> linearTicks(double low, double high, int count) {
  std::vector<double> ticks;
  if (!(high > low)) return {low};
  const double raw = (high - low) / std::max(1, count);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (const double factor : {1.0, 2.0, 5.0, 10.0}) {
    step = factor * power;
    if (step >= raw) break;
  }
  if (!(step > 0) || !std::isfinite(step)) return {low};
  const double first = std::ceil(low / step);
  for (int k = 0; k <= 50; ++k) {
    const double tick = (first + k) * step;
    if (tick > high + step * 1e-9) break;
    ticks.push_back(std::fabs(tick) < step * 1e-9 ? 0.0 : tick);
  }
  return ticks;
}

// Evenly spaced picks of at most `limit` of `values` (the page stays bounded).
std::vector<double> thinned(const std::vector<double>& values, std::size_t limit) {
  if (values.size() <= limit) return values;
  std::vector<double> out;
  out.reserve(limit);
  for (std::size_t i = 0; i < limit; ++i) out.push_back(values[i * values.size() / limit]);
  return out;
}

// By nearest rank, as the report's `timings` are, so that the page and the table agree.
double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(std::max<std::size_t>(rank, 1), values.size()) - 1];
}

// A deterministic jitter in [-1, 1] for the i-th dot.
double jitter(std::size_t i) {
  std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return static_cast<double>(x % 2001) / 1000.0 - 1.0;
}

std::vector<double> Axis::ticks(int count) const {
  if (!log) return linearTicks(low, high, count);
  std::vector<double> decades;
  const int lowest = static_cast<int>(std::floor(std::log10(low)));
  for (int power = lowest; power <= lowest + 40; ++power) {
    const double decade = std::pow(10.0, power);
    if (decade > high * 1.0001) break;
    decades.push_back(decade);
  }
  // Decades alone where the axis spans several; 1-2-5 within each where it spans few.
  const bool fine = decades.size() <= 3;
  std::vector<double> out;
  for (const double decade : decades) {
    for (const double factor : {1.0, 2.0, 5.0}) {
      if (factor != 1.0 && !fine) continue;
      const double tick = decade * factor;
      if (tick >= low * 0.9999 && tick <= high * 1.0001) out.push_back(tick);
    }
  }
  if (out.size() < 2) return linearTicks(low, high, count);
  return out;
}

void badge(std::string& out, const std::string& word) {
  out += "<span class=\"badge b-" + esc(word) + "\">" + esc(word) + "</span>";
}

}  // namespace detail
}  // namespace hmc::render
