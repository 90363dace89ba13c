#pragma once
// Zeller's delta debugging (ddmin, "Simplifying and Isolating Failure-Inducing Input", 2002)
// over the indices 0..count-1: the smallest subset found, by halving granularity, for which
// `test` still holds. Torch-free and pure.

#include <cstddef>
#include <functional>
#include <vector>

namespace hmc::scenario {

// Whether the items at these indices (ascending) still show the failure.
using SubsetTest = std::function<bool(const std::vector<std::size_t>& kept)>;

// A 1-minimal subset of 0..count-1 (no single chunk at the last granularity can go) for which
// `test` holds, assuming it holds for the whole set (never tested). Tries each chunk alone,
// then each complement, and doubles the granularity when neither holds. When `stop` returns
// true (checked before each test) it returns the smallest subset found so far, for which
// `test` held. Never returns an empty subset while count > 0.
std::vector<std::size_t> ddmin(std::size_t count, const SubsetTest& test,
                               const std::function<bool()>& stop = {});

}  // namespace hmc::scenario
