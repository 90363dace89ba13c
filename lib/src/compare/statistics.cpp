#include "hmc/compare/statistics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "hmc/error.hpp"

namespace hmc::compare {
namespace {

void requireFinite(const std::vector<double>& values, const char* which) {
  if (values.empty()) {
    throw ValueError(fmt::format("Mann-Whitney U test: the {} sample is empty", which));
  }
  for (double v : values) {
    if (!std::isfinite(v)) {
      throw ValueError(fmt::format(
          "Mann-Whitney U test: the {} sample holds a non-finite value ({})", which, v));
    }
  }
}

// counts[u] = number of arrangements of m + n distinct values in which U of the m-sample is u.
// f(i, j, u) = f(i - 1, j, u - j) + f(i, j - 1, u): the largest value is the m-sample's (it beats
// all j others) or the n-sample's (it beats none).
std::vector<double> exactCounts(std::size_t m, std::size_t n) {
  // f[i] holds f(i, j, .) for the current j; f(i, 0, u) = [u == 0].
  std::vector<std::vector<double>> f(m + 1, std::vector<double>(m * n + 1, 0.0));
  for (auto& row : f) row[0] = 1.0;
  for (std::size_t j = 1; j <= n; ++j) {
    for (std::size_t i = 1; i <= m; ++i) {
      // f(i, j, u) = f(i - 1, j, u - j) + f(i, j - 1, u); f[i - 1] already holds column j.
      const std::size_t top = i * j;
      for (std::size_t u = top + 1; u-- > j;) f[i][u] += f[i - 1][u - j];
    }
  }
  return f[m];
}

// counts[t] = number of the 2^n sign patterns of ranks 1..n whose positive rank sum is t.
std::vector<double> signedRankCounts(std::size_t n) {
  std::vector<double> counts(n * (n + 1) / 2 + 1, 0.0);
  counts[0] = 1.0;
  std::size_t top = 0;
  for (std::size_t rank = 1; rank <= n; ++rank) {
    top += rank;
    for (std::size_t t = top + 1; t-- > rank;) counts[t] += counts[t - rank];
  }
  return counts;
}

void requireFiniteDifferences(const std::vector<double>& values, const char* what) {
  if (values.empty()) throw ValueError(fmt::format("{}: no paired differences", what));
  for (double v : values) {
    if (!std::isfinite(v)) {
      throw ValueError(fmt::format("{}: a paired difference is not finite ({})", what, v));
    }
  }
}

double binomial(std::size_t n, std::size_t k) {
  k = std::min(k, n - k);
  double result = 1;
  for (std::size_t i = 1; i <= k; ++i) result = result * static_cast<double>(n - k + i) / i;
  return result;
}

// The interval from the cut-th smallest to the cut-th largest of `sorted` (cut at most half of
// them), unbounded when cut is 0: the confidence bounds of a rank test's shift estimate.
ShiftInterval intervalAtCut(const std::vector<double>& sorted, std::size_t cut) {
  ShiftInterval out;
  cut = std::min(cut, sorted.size() / 2);
  if (cut == 0) {
    out.lower = -std::numeric_limits<double>::infinity();
    out.upper = std::numeric_limits<double>::infinity();
    return out;
  }
  out.lower = sorted[cut - 1];
  out.upper = sorted[sorted.size() - cut];
  return out;
}

}  // namespace

UTestResult mannWhitneyU(const std::vector<double>& first, const std::vector<double>& second) {
  requireFinite(first, "first");
  requireFinite(second, "second");
  const std::size_t n1 = first.size();
  const std::size_t n2 = second.size();
  const std::size_t n = n1 + n2;

  // Midranks over the pooled values, and the tie term sum(t^3 - t).
  std::vector<std::pair<double, bool>> pooled;  // value, from the first sample
  pooled.reserve(n);
  for (double v : first) pooled.emplace_back(v, true);
  for (double v : second) pooled.emplace_back(v, false);
  std::sort(pooled.begin(), pooled.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  double rankSumFirst = 0;
  double tieTerm = 0;
  for (std::size_t start = 0; start < n;) {
    std::size_t end = start + 1;
    while (end < n && pooled[end].first == pooled[start].first) ++end;
    const double t = static_cast<double>(end - start);
    const double midrank = (static_cast<double>(start + 1) + static_cast<double>(end)) / 2.0;
    for (std::size_t k = start; k < end; ++k) {
      if (pooled[k].second) rankSumFirst += midrank;
    }
    tieTerm += t * t * t - t;
    start = end;
  }

  UTestResult result;
  result.ties = tieTerm > 0;
  const double d1 = static_cast<double>(n1);
  const double d2 = static_cast<double>(n2);
  result.u1 = rankSumFirst - d1 * (d1 + 1) / 2.0;
  result.u2 = d1 * d2 - result.u1;
  const double u = std::max(result.u1, result.u2);

  const std::size_t small = std::min(n1, n2);
  const std::size_t large = std::max(n1, n2);
  if (!result.ties && small <= kExactMaxSmallSide && large <= kExactMaxLargeSide) {
    result.exact = true;
    const std::vector<double> counts = exactCounts(small, large);
    const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
    // U is an integer without ties; sum P(U' >= u).
    const auto from = static_cast<std::size_t>(std::llround(u));
    double tail = 0;
    for (std::size_t k = from; k < counts.size(); ++k) tail += counts[k];
    result.pValue = std::min(1.0, 2.0 * tail / total);
    return result;
  }
  const double dn = static_cast<double>(n);
  const double variance = d1 * d2 / 12.0 * ((dn + 1) - tieTerm / (dn * (dn - 1)));
  if (variance <= 0) {
    result.pValue = 1.0;  // every value tied: no evidence of a difference
    return result;
  }
  const double z = (u - d1 * d2 / 2.0 - 0.5) / std::sqrt(variance);
  result.pValue = std::min(1.0, std::erfc(z / std::sqrt(2.0)));
  return result;
}

double smallestPValue(std::size_t n1, std::size_t n2) {
  if (n1 == 0 || n2 == 0) return 1.0;
  return std::min(1.0, 2.0 / binomial(n1 + n2, n1));
}

std::size_t minimumSamplesPerSide(double alpha) {
  if (!(alpha > 0 && alpha < 1)) {
    throw ValueError(fmt::format("alpha must be in (0, 1), got {}", alpha));
  }
  std::size_t n = 2;
  while (smallestPValue(n, n) >= alpha) ++n;  // 2 / C(2n, n) falls about 4x per step
  return n;
}

bool ShiftInterval::bounded() const noexcept { return std::isfinite(lower) && std::isfinite(upper); }

double normalUpperQuantile(double tail) {
  if (!(tail > 0 && tail < 1)) {
    throw ValueError(fmt::format("normal quantile: the tail must be in (0, 1), got {}", tail));
  }
  // P(Z > z) = erfc(z / sqrt 2) / 2 falls with z: bisection to double precision.
  double low = -40;
  double high = 40;
  for (int i = 0; i < 200 && high - low > 1e-12; ++i) {
    const double mid = (low + high) / 2;
    (std::erfc(mid / std::sqrt(2.0)) / 2 > tail ? low : high) = mid;
  }
  return (low + high) / 2;
}

ShiftInterval shiftInterval(const std::vector<double>& first, const std::vector<double>& second,
                            double confidence) {
  requireFinite(first, "first");
  requireFinite(second, "second");
  if (!(confidence > 0 && confidence < 1)) {
    throw ValueError(fmt::format("the confidence level must be in (0, 1), got {}", confidence));
  }
  const std::size_t n1 = first.size();
  const std::size_t n2 = second.size();
  std::vector<double> differences;
  differences.reserve(n1 * n2);
  for (double x : first) {
    for (double y : second) differences.push_back(y - x);
  }
  std::sort(differences.begin(), differences.end());
  const std::size_t count = differences.size();
  ShiftInterval out;
  out.shift = count % 2 == 1 ? differences[count / 2]
                             : (differences[count / 2 - 1] + differences[count / 2]) / 2;
  const double tail = (1 - confidence) / 2;
  // cut: how many differences each end leaves out.
  std::size_t cut = 0;
  const std::size_t small = std::min(n1, n2);
  const std::size_t large = std::max(n1, n2);
  if (small <= kExactMaxSmallSide && large <= kExactMaxLargeSide) {
    const std::vector<double> counts = exactCounts(small, large);
    const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
    double below = 0;  // P(U <= cut - 1)
    while (cut < counts.size() && below + counts[cut] / total <= tail) below += counts[cut++] / total;
  } else {
    const double d1 = static_cast<double>(n1);
    const double d2 = static_cast<double>(n2);
    const double sigma = std::sqrt(d1 * d2 * (d1 + d2 + 1) / 12.0);
    const double c = std::floor(d1 * d2 / 2.0 - normalUpperQuantile(tail) * sigma);
    cut = c > 0 ? static_cast<std::size_t>(c) : 0;
  }
  const ShiftInterval bounds = intervalAtCut(differences, cut);
  out.lower = bounds.lower;
  out.upper = bounds.upper;
  return out;
}

std::vector<double> holmAdjust(const std::vector<double>& pValues) {
  for (double p : pValues) {
    if (!(p >= 0 && p <= 1)) {
      throw ValueError(fmt::format("Holm adjustment: p-value {} is not in [0, 1]", p));
    }
  }
  const std::size_t m = pValues.size();
  std::vector<std::size_t> order(m);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return pValues[a] < pValues[b]; });
  std::vector<double> adjusted(m, 1.0);
  double running = 0;  // step-down: an adjusted p never falls below an earlier one
  for (std::size_t k = 0; k < m; ++k) {
    const double scaled = std::min(1.0, static_cast<double>(m - k) * pValues[order[k]]);
    running = std::max(running, scaled);
    adjusted[order[k]] = running;
  }
  return adjusted;
}

SignedRankResult wilcoxonSignedRank(const std::vector<double>& differences) {
  requireFiniteDifferences(differences, "Wilcoxon signed-rank test");
  std::vector<double> magnitudes;  // |d| of the nonzero differences, sign kept apart
  std::vector<bool> positive;
  std::vector<std::size_t> order;
  for (double d : differences) {
    if (d == 0) continue;
    magnitudes.push_back(std::fabs(d));
    positive.push_back(d > 0);
  }
  SignedRankResult result;
  const std::size_t n = magnitudes.size();
  result.used = n;
  if (n == 0) return result;
  order.resize(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return magnitudes[a] < magnitudes[b]; });
  double tieTerm = 0;
  for (std::size_t start = 0; start < n;) {
    std::size_t end = start + 1;
    while (end < n && magnitudes[order[end]] == magnitudes[order[start]]) ++end;
    const double t = static_cast<double>(end - start);
    const double midrank = (static_cast<double>(start + 1) + static_cast<double>(end)) / 2.0;
    for (std::size_t k = start; k < end; ++k) {
      (positive[order[k]] ? result.tPlus : result.tMinus) += midrank;
    }
    tieTerm += t * t * t - t;
    start = end;
  }
  const double t = std::max(result.tPlus, result.tMinus);
  if (tieTerm == 0 && n <= kSignedRankExactMax) {
    result.exact = true;
    const std::vector<double> counts = signedRankCounts(n);
    const double total = std::ldexp(1.0, static_cast<int>(n));
    double tail = 0;
    for (auto k = static_cast<std::size_t>(std::llround(t)); k < counts.size(); ++k) {
      tail += counts[k];
    }
    result.pValue = std::min(1.0, 2.0 * tail / total);
    return result;
  }
  const double dn = static_cast<double>(n);
  const double variance = dn * (dn + 1) * (2 * dn + 1) / 24.0 - tieTerm / 48.0;
  if (variance <= 0) return result;
  const double z = (t - dn * (dn + 1) / 4.0 - 0.5) / std::sqrt(variance);
  result.pValue = std::min(1.0, std::erfc(z / std::sqrt(2.0)));
  return result;
}

double smallestPairedPValue(std::size_t pairs) {
  return std::min(1.0, 2.0 / std::ldexp(1.0, static_cast<int>(std::min<std::size_t>(pairs, 1000))));
}

ShiftInterval pairedShiftInterval(const std::vector<double>& differences, double confidence) {
  requireFiniteDifferences(differences, "paired shift interval");
  if (!(confidence > 0 && confidence < 1)) {
    throw ValueError(fmt::format("the confidence level must be in (0, 1), got {}", confidence));
  }
  const std::size_t n = differences.size();
  std::vector<double> walsh;
  walsh.reserve(n * (n + 1) / 2);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i; j < n; ++j) walsh.push_back((differences[i] + differences[j]) / 2);
  }
  std::sort(walsh.begin(), walsh.end());
  const std::size_t count = walsh.size();
  ShiftInterval out;
  out.shift = count % 2 == 1 ? walsh[count / 2] : (walsh[count / 2 - 1] + walsh[count / 2]) / 2;
  const double tail = (1 - confidence) / 2;
  std::size_t cut = 0;
  if (n <= kSignedRankExactMax) {
    const std::vector<double> counts = signedRankCounts(n);
    const double total = std::ldexp(1.0, static_cast<int>(n));
    double below = 0;  // P(T+ <= cut - 1)
    while (cut < counts.size() && below + counts[cut] / total <= tail)
      below += counts[cut++] / total;
  } else {
    const double dn = static_cast<double>(n);
    const double sigma = std::sqrt(dn * (dn + 1) * (2 * dn + 1) / 24.0);
    const double c = std::floor(dn * (dn + 1) / 4.0 - normalUpperQuantile(tail) * sigma);
    cut = c > 0 ? static_cast<std::size_t>(c) : 0;
  }
  const ShiftInterval bounds = intervalAtCut(walsh, cut);
  out.lower = bounds.lower;
  out.upper = bounds.upper;
  return out;
}

double median(std::vector<double> values) {
  if (values.empty()) throw ValueError("median of no values");
  const std::size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower =
      *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2.0;
}

double geometricMean(const std::vector<double>& ratios) {
  if (ratios.empty()) throw ValueError("geometric mean of no ratios");
  double logSum = 0;
  for (double r : ratios) {
    if (!(r > 0) || !std::isfinite(r)) {
      throw ValueError(fmt::format("geometric mean: ratio {} is not a positive number", r));
    }
    logSum += std::log(r);
  }
  return std::exp(logSum / static_cast<double>(ratios.size()));
}

}  // namespace hmc::compare
