#pragma once
// What the lifecycle manager sees of a resource: the abstract execution resource of a group
// (a workspace), and the binding (device, dtype) it was created for.

#include <nlohmann/json.hpp>
#include <string>

namespace hmc::lifecycle {

class Resource {
 public:
  virtual ~Resource() = default;
  // Rank-independent description compared across ranks in every manifest
  // (the reference's `lifecycle_signature()`).
  virtual nlohmann::json lifecycleSignature() const = 0;
  // False while work is in flight or a backward is pending.
  virtual bool canClose() const = 0;
  // Frees the resource. Called on every rank inside a collective; may throw, and must be safe
  // to call again after a failure (a retry).
  virtual void close() = 0;
};

// The device and dtype of the first input, as torch spells them ("cpu", "cuda:0";
// "float32"). The lifecycle layer compares them and never interprets them.
struct Binding {
  std::string device;
  std::string dtype;

  bool operator==(const Binding& other) const {
    return device == other.device && dtype == other.dtype;
  }
  bool operator!=(const Binding& other) const { return !(*this == other); }
  // Python's repr of the reference's (tensor.device, tensor.dtype) tuple:
  // "(device(type='cuda', index=0), torch.float16)".
  std::string repr() const;
  nlohmann::json toJson() const { return nlohmann::json::array({device, dtype}); }
};

}  // namespace hmc::lifecycle
