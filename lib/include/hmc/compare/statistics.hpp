#pragma once
// Statistics for comparing two sets of timing samples (hmc-run compare): the two-sided
// Mann-Whitney U test that Google Benchmark's tools/compare.py uses, medians and the geometric
// mean of ratios. Pure functions, no torch, thread safe.
//
// How the U test handles ties and small samples (the same rules as scipy.stats.mannwhitneyu
// with method="auto", which compare.py calls):
// - Ties get midranks (the mean of the ranks they span); U of the baseline is its rank sum
//   minus n1 (n1 + 1) / 2.
// - No ties and at least one side with at most kExactMaxSmallSide samples (and the other at
//   most kExactMaxLargeSide): the exact null distribution of U (every arrangement of the
//   n1 + n2 values equally likely), p = 2 P(U >= max(U1, U2)), capped at 1.
// - Otherwise the normal approximation with the tie-corrected variance
//     sigma^2 = n1 n2 / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1)))   (t: size of a tie group)
//   and a continuity correction of 0.5: z = (max(U1, U2) - n1 n2 / 2 - 0.5) / sigma,
//   p = 2 (1 - Phi(z)), capped at 1. When every value is tied (sigma = 0), p = 1.
// - Too few samples to decide: with n1 and n2 samples the smallest two-sided p-value the test
//   can give is 2 / C(n1 + n2, n1) (no ties, complete separation). When that is not below
//   alpha the test cannot find a difference however large; minimumSamplesPerSide(alpha) says
//   how many samples per side are needed (4 for alpha = 0.05, 5 for 0.01).

#include <cstddef>
#include <vector>

namespace hmc::compare {

inline constexpr std::size_t kExactMaxSmallSide = 8;
inline constexpr std::size_t kExactMaxLargeSide = 2000;

struct UTestResult {
  double u1 = 0;       // U of the first sample (pairs where it is larger, ties count 1/2)
  double u2 = 0;       // n1 n2 - u1
  double pValue = 1;   // two-sided
  bool exact = false;  // exact null distribution (else the normal approximation)
  bool ties = false;   // some values occur more than once across both samples
};

// Two-sided Mann-Whitney U test of `first` against `second`. Throws ValueError when either is
// empty or holds a NaN or infinity.
UTestResult mannWhitneyU(const std::vector<double>& first, const std::vector<double>& second);

// 2 / C(n1 + n2, n1), capped at 1: the smallest two-sided p-value the test can reach.
double smallestPValue(std::size_t n1, std::size_t n2);

// The smallest n >= 2 such that n samples per side can reach p < alpha. Throws ValueError
// unless 0 < alpha < 1.
std::size_t minimumSamplesPerSide(double alpha);

// The Hodges-Lehmann estimate of the shift from `first` to `second` (the median of the n1 n2
// differences second[j] - first[i]) and its rank-based (Moses) confidence interval at level
// `confidence`: [D(c), D(N + 1 - c)] of the N = n1 n2 sorted differences, c the largest count
// with P(U <= c - 1) <= (1 - confidence) / 2 under the null (the exact distribution where the U
// test uses it, else the normal approximation). Without ties its coverage is at least
// `confidence` for any continuous distribution shifted by a constant. Too few samples for that
// confidence (c = 0): the ends are -infinity and +infinity.
struct ShiftInterval {
  double shift = 0;
  double lower = 0;
  double upper = 0;
  bool bounded() const noexcept;
};

// Throws ValueError when either sample is empty or holds a non-finite value, or unless
// 0 < confidence < 1.
ShiftInterval shiftInterval(const std::vector<double>& first, const std::vector<double>& second,
                            double confidence);

// Holm's step-down adjustment of m p-values (family-wise error rate at most alpha when a
// hypothesis is rejected where its adjusted p < alpha, whatever the dependence between the
// tests): sorted ascending p(1) <= ... <= p(m), adjusted p(k) = max over j <= k of
// min(1, (m - j + 1) p(j)). Returned in the input's order. Throws ValueError on a value outside
// [0, 1] (or NaN).
std::vector<double> holmAdjust(const std::vector<double>& pValues);

// Wilcoxon's signed-rank test of paired differences against a median of 0 (two-sided), as
// scipy.stats.wilcoxon with zero_method="wilcox": zero differences are dropped, the rest ranked
// by absolute value (ties get midranks); T+ is the rank sum of the positive ones. No ties and at
// most kSignedRankExactMax differences: the exact null distribution (each sign equally likely),
// p = 2 P(T >= max(T+, T-)), capped at 1; otherwise the normal approximation with the
// tie-corrected variance n (n + 1) (2n + 1) / 24 - sum(t^3 - t) / 48 and a continuity correction
// of 0.5. No nonzero difference: p = 1. Throws ValueError when empty or non-finite.
inline constexpr std::size_t kSignedRankExactMax = 50;
struct SignedRankResult {
  double tPlus = 0;
  double tMinus = 0;
  std::size_t used = 0;  // nonzero differences
  double pValue = 1;
  bool exact = false;
};
SignedRankResult wilcoxonSignedRank(const std::vector<double>& differences);

// 2 / 2^n, capped at 1: the smallest two-sided p-value the signed-rank test can reach with n
// pairs.
double smallestPairedPValue(std::size_t pairs);

// The one-sample Hodges-Lehmann estimate of paired differences (the median of the N = n (n + 1)
// / 2 Walsh averages (d[i] + d[j]) / 2, i <= j) and its signed-rank interval at `confidence`:
// [W(c), W(N + 1 - c)] of the sorted Walsh averages, c the largest count with
// P(T+ <= c - 1) <= (1 - confidence) / 2 under the null (exact up to kSignedRankExactMax pairs,
// else the normal approximation). Too few pairs for that level: unbounded ends. Throws
// ValueError when empty or non-finite, or unless 0 < confidence < 1.
ShiftInterval pairedShiftInterval(const std::vector<double>& differences, double confidence);

// z with P(Z > z) = tail for a standard normal Z (0 < tail < 1).
double normalUpperQuantile(double tail);

// Median (the mean of the two middle values for an even count). Throws ValueError when empty.
double median(std::vector<double> values);

// Geometric mean of positive ratios. Throws ValueError when empty or a ratio is not > 0.
double geometricMean(const std::vector<double>& ratios);

}  // namespace hmc::compare
