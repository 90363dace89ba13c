#include "hmc/scenario/ddmin.hpp"

#include <algorithm>
#include <numeric>

namespace hmc::scenario {
namespace {

// `items` cut into `n` chunks of nearly equal size, in order.
std::vector<std::vector<std::size_t>> chunks(const std::vector<std::size_t>& items, std::size_t n) {
  std::vector<std::vector<std::size_t>> out;
  std::size_t begin = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t end = items.size() * (i + 1) / n;
    if (end > begin) out.emplace_back(items.begin() + begin, items.begin() + end);
    begin = end;
  }
  return out;
}

std::vector<std::size_t> without(const std::vector<std::size_t>& items,
                                 const std::vector<std::size_t>& chunk) {
  std::vector<std::size_t> out;
  out.reserve(items.size() - chunk.size());
  std::set_difference(items.begin(), items.end(), chunk.begin(), chunk.end(),
                      std::back_inserter(out));
  return out;
}

}  // namespace

std::vector<std::size_t> ddmin(std::size_t count, const SubsetTest& test,
                               const std::function<bool()>& stop) {
  std::vector<std::size_t> current(count);
  std::iota(current.begin(), current.end(), std::size_t{0});
  auto stopped = [&stop] { return stop && stop(); };
  std::size_t n = 2;
  while (current.size() >= 2) {
    const auto parts = chunks(current, std::min(n, current.size()));
    bool reduced = false;
    for (const auto& part : parts) {
      if (stopped()) return current;
      if (parts.size() > 2 && test(part)) {  // with two chunks the complements are the chunks
        current = part;
        n = 2;
        reduced = true;
        break;
      }
    }
    if (!reduced) {
      for (const auto& part : parts) {
        if (stopped()) return current;
        auto rest = without(current, part);
        if (test(rest)) {
          current = std::move(rest);
          n = std::max<std::size_t>(n - 1, 2);
          reduced = true;
          break;
        }
      }
    }
    if (!reduced) {
      if (n >= current.size()) break;
      n = std::min(n * 2, current.size());
    }
  }
  return current;
}

}  // namespace hmc::scenario
