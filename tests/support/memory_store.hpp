#pragma once
// A KeyValueStore in memory (key_value_store.hpp) for tests of what runs over a rank's store
// without processes or LibTorch: it counts the writes of every key, and can be made to fail
// every request from a point on (a store whose host died) or stall every request (a store
// that does not answer).

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/key_value_store.hpp"
#include "hmc/error.hpp"

namespace hmc::testing {

// A KeyValueStore in memory that counts the writes of every key.
class MemoryStore final : public hmc::collective::KeyValueStore {
 public:
  // From now on every request throws BackendError, as a store whose server is gone.
  void fail() { failed_ = true; }
  // From now on every request waits `delay` before it is answered, as a store that stalls.
  void stall(std::chrono::milliseconds delay) { stall_ = delay.count(); }
  // How many requests of any kind it answered or refused.
  std::size_t requests() const { return requests_.load(); }

  void set(const std::string& key, const hmc::collective::Bytes& value) override {
    request();
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
    ++writes_[key];
  }
  hmc::collective::Bytes get(const std::string& key, std::chrono::milliseconds) override {
    request();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) throw hmc::TimeoutError("no key " + key);
    return it->second;
  }
  bool check(const std::vector<std::string>& keys) override {
    request();
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& key : keys) {
      if (values_.count(key) == 0) return false;
    }
    return true;
  }
  bool deleteKey(const std::string& key) override {
    request();
    std::lock_guard<std::mutex> lock(mutex_);
    ++writes_[key];
    return values_.erase(key) > 0;
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    request();
    std::lock_guard<std::mutex> lock(mutex_);
    const std::int64_t value = values_.count(key) ? std::stoll(values_[key]) + delta : delta;
    values_[key] = std::to_string(value);
    if (delta != 0) ++writes_[key];
    return value;
  }
  int writes(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return writes_[key];
  }
  std::size_t totalWrites() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t total = 0;
    for (const auto& [key, count] : writes_) total += static_cast<std::size_t>(count);
    return total;
  }

 private:
  void request() {
    ++requests_;
    if (const auto delay = stall_.load(); delay > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    }
    if (failed_) throw hmc::BackendError("the store server at memory:0 is gone (test)");
  }

  std::atomic<bool> failed_{false};
  std::atomic<std::int64_t> stall_{0};
  std::atomic<std::size_t> requests_{0};
  std::mutex mutex_;
  std::map<std::string, std::string> values_;
  std::map<std::string, int> writes_;
};

}  // namespace hmc::testing
