#pragma once
// One process-owned (per rank) group of execution resources shared by compatible modules:
// the reference's `_ExecutionResourceGroup`. Plain state owned by the ResourceManager; the
// modules of the group hold it too, so that a closed group still answers `closed`.

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "hmc/lifecycle/resource.hpp"

namespace hmc::lifecycle {

using GroupId = std::int64_t;
using MemberToken = std::int64_t;
using BindingId = std::int64_t;

struct ResourceGroup {
  GroupId identifier = 0;
  std::set<MemberToken> members;
  nlohmann::json specification;
  nlohmann::json compatibilityKey;
  nlohmann::json scopeKey;
  std::shared_ptr<Resource> resources;  // null until bound, and after close
  std::optional<Binding> binding;
  bool shared = false;
  std::optional<BindingId> bindingId;
  bool closing = false;
  bool closed = false;
  std::optional<std::string> moduleType;  // the concrete module type that bound it

  // The manager's cache of the lifecycle signature's digest for `resources` (recomputed when
  // the resources change; the group's reference keeps the pointer from being reused).
  const Resource* digestOf = nullptr;
  std::uint64_t signatureDigest = 0;
};

using GroupPtr = std::shared_ptr<ResourceGroup>;

}  // namespace hmc::lifecycle
