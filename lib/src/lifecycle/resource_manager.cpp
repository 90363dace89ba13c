#include "hmc/lifecycle/resource_manager.hpp"

#include <algorithm>

#include "hmc/error.hpp"

namespace hmc::lifecycle {
namespace {

using nlohmann::json;

thread_local std::shared_ptr<ResourceManager> tCurrent;

json manifestOf(const std::vector<GroupPtr>& bound) {
  json manifest = json::array();
  for (const GroupPtr& group : bound) {
    manifest.push_back(json::array({*group->bindingId, group->resources->lifecycleSignature()}));
  }
  return manifest;
}

collective::Bytes encode(const json& value) {
  collective::Bytes out;
  json::to_cbor(value, out);
  return out;
}

std::vector<json> decodeAll(const std::vector<collective::Bytes>& peers) {
  std::vector<json> out;
  out.reserve(peers.size());
  for (const auto& bytes : peers) out.push_back(json::from_cbor(bytes));
  return out;
}

// Every rank's manifest and the first difference against rank 0's, for the report.
json describeMismatch(std::string_view stage, const std::vector<json>& peers, bool withSignature) {
  json ranks = json::array();
  json first = nullptr;
  const json& reference = peers.front();
  for (std::size_t rank = 0; rank < peers.size(); ++rank) {
    const json& manifest = peers[rank].at(0);
    json entry = {{"rank", rank}, {"manifest", manifest}};
    if (withSignature) entry["signature"] = peers[rank].at(1);
    ranks.push_back(std::move(entry));
    if (!first.is_null()) continue;
    const json& expected = reference.at(0);
    const std::size_t common = std::min(manifest.size(), expected.size());
    for (std::size_t i = 0; i < common && first.is_null(); ++i) {
      if (manifest[i] != expected[i]) {
        first = {{"rank", rank}, {"index", i}, {"rank0", expected[i]}, {"this_rank", manifest[i]}};
      }
    }
    if (first.is_null() && manifest.size() != expected.size()) {
      first = {{"rank", rank},
               {"index", common},
               {"rank0", common < expected.size() ? expected[common] : json(nullptr)},
               {"this_rank", common < manifest.size() ? manifest[common] : json(nullptr)}};
    }
    if (first.is_null() && withSignature && peers[rank].at(1) != reference.at(1)) {
      first = {{"rank", rank}, {"signature", true}, {"rank0", reference.at(1)},
               {"this_rank", peers[rank].at(1)}};
    }
  }
  return {{"stage", stage}, {"ranks", std::move(ranks)}, {"first_difference", std::move(first)}};
}

}  // namespace

ResourceManager::ResourceManager(std::shared_ptr<collective::Collective> collective)
    : collective_(std::move(collective)) {
  if (!collective_) throw ValueError("a ResourceManager needs a collective");
}

ResourceManager::~ResourceManager() = default;

std::shared_ptr<ResourceManager> ResourceManager::processDefault() {
  static const std::shared_ptr<ResourceManager> manager =
      std::make_shared<ResourceManager>(std::make_shared<collective::LocalCollective>());
  return manager;
}

std::shared_ptr<ResourceManager> ResourceManager::current() {
  return tCurrent ? tCurrent : processDefault();
}

ResourceManager::Scope::Scope(std::shared_ptr<ResourceManager> manager)
    : previous_(std::exchange(tCurrent, std::move(manager))) {}

ResourceManager::Scope::~Scope() { tCurrent = std::move(previous_); }

std::pair<GroupPtr, MemberToken> ResourceManager::createGroup(json specification,
                                                              json compatibilityKey,
                                                              json scopeKey) {
  auto group = std::make_shared<ResourceGroup>();
  group->identifier = nextGroupId_++;
  const MemberToken token = nextMemberToken_++;
  group->members.insert(token);
  group->specification = std::move(specification);
  group->compatibilityKey = std::move(compatibilityKey);
  group->scopeKey = std::move(scopeKey);
  groups_[group->identifier] = group;
  return {group, token};
}

MemberToken ResourceManager::addMember(ResourceGroup& group) {
  const MemberToken token = nextMemberToken_++;
  group.members.insert(token);
  return token;
}

void ResourceManager::retire(GroupId groupId, MemberToken memberToken) {
  auto it = groups_.find(groupId);
  if (it == groups_.end()) return;
  GroupPtr group = it->second;
  group->members.erase(memberToken);
  if (!group->members.empty() || group->resources != nullptr) return;
  group->closed = true;
  groups_.erase(groupId);
}

void ResourceManager::recycle(ResourceGroup& target, const Binding& binding,
                              const json& signature) {
  const std::vector<GroupPtr> bound = boundGroups(groups());
  const json manifest = manifestOf(bound);
  json states = json::array();
  const auto targetKey = std::tie(target.compatibilityKey, target.scopeKey, target.shared,
                                  target.moduleType);
  for (const GroupPtr& group : bound) {
    const bool idle = group->members.empty() && !group->closing && group->resources->canClose();
    const bool compatible =
        std::tie(group->compatibilityKey, group->scopeKey, group->shared, group->moduleType) ==
            targetKey &&
        group->binding == binding;
    states.push_back(json::array({idle, compatible}));
  }
  const json mine = json::array({manifest, signature, states});
  const std::vector<json> peers =
      decodeAll(collective_->exchange(kRecycleStage, encode(mine)));
  for (const json& peer : peers) {
    if (peer.at(0) != manifest || peer.at(1) != signature) {
      lastMismatch_ = describeMismatch(kRecycleStage, peers, true);
      throw RuntimeError("multicore resource binding order or specifications differ across ranks");
    }
  }
  GroupPtr reusable;
  for (std::size_t index = 0; index < bound.size(); ++index) {
    const bool idleEverywhere = std::all_of(peers.begin(), peers.end(), [&](const json& peer) {
      return peer.at(2).at(index).at(0).get<bool>();
    });
    if (!idleEverywhere) continue;
    const bool compatibleEverywhere =
        std::all_of(peers.begin(), peers.end(),
                    [&](const json& peer) { return peer.at(2).at(index).at(1).get<bool>(); });
    if (!reusable && compatibleEverywhere) {
      reusable = bound[index];
    } else {
      closeGroupCollectively(bound[index]);
    }
  }
  if (reusable) {
    target.resources = std::exchange(reusable->resources, nullptr);
    target.binding = reusable->binding;
    target.bindingId = reusable->bindingId;
    reusable->closed = true;
    groups_.erase(reusable->identifier);
  }
}

void ResourceManager::closeGroups(std::optional<std::vector<GroupPtr>> requested) {
  const std::vector<GroupPtr> selected = requested ? std::move(*requested) : groups();
  const std::vector<GroupPtr> bound = boundGroups(selected);
  validateCollectiveClose(bound);
  for (const GroupPtr& group : bound) closeGroupCollectively(group);
  for (const GroupPtr& group : selected) {
    if (group->resources == nullptr) {
      group->closed = true;
      group->members.clear();
      groups_.erase(group->identifier);
    }
  }
  const bool anyBound = std::any_of(groups_.begin(), groups_.end(),
                                    [](const auto& entry) { return entry.second->resources; });
  if (runtimeRelease_ && !anyBound) {
    const std::function<void()> release = runtimeRelease_;
    collective_->collectiveCall(kRuntimeReleaseStage, [&] { releaseRuntime(release); });
    runtimeRelease_ = nullptr;
    runtimeReleased_ = false;
  }
}

void ResourceManager::releaseRuntime(const std::function<void()>& release) {
  if (!runtimeReleased_) {
    release();
    runtimeReleased_ = true;
  }
}

std::vector<GroupPtr> ResourceManager::boundGroups(const std::vector<GroupPtr>& groups) {
  std::vector<GroupPtr> bound;
  for (const GroupPtr& group : groups) {
    if (group->resources) bound.push_back(group);
  }
  std::stable_sort(bound.begin(), bound.end(), [](const GroupPtr& a, const GroupPtr& b) {
    return *a->bindingId < *b->bindingId;
  });
  return bound;
}

void ResourceManager::validateCollectiveClose(const std::vector<GroupPtr>& bound) {
  const json manifest = manifestOf(bound);
  const bool ready = std::all_of(bound.begin(), bound.end(),
                                 [](const GroupPtr& group) { return group->resources->canClose(); });
  const std::vector<json> peers = decodeAll(
      collective_->exchange(kCloseValidationStage, encode(json::array({manifest, ready}))));
  for (const json& peer : peers) {
    if (peer.at(0) != manifest) {
      lastMismatch_ = describeMismatch(kCloseValidationStage, peers, false);
      throw RuntimeError("multicore resource manifests differ across ranks");
    }
  }
  for (const json& peer : peers) {
    if (!peer.at(1).get<bool>()) {
      throw RuntimeError(
          "multicore cleanup requires idle workspaces and no pending backward graphs");
    }
  }
}

void ResourceManager::closeGroupCollectively(const GroupPtr& group) {
  group->closing = true;
  collective_->collectiveCall(kResourceCloseStage, [&] { group->resources->close(); });
  // Ownership transfers only after every peer succeeds; retries require the same manifest.
  group->resources = nullptr;
  group->binding.reset();
  group->closed = true;
  group->members.clear();
  groups_.erase(group->identifier);
}

std::vector<json> ResourceManager::activeSpecifications(const json& scopeKey) const {
  std::vector<json> specifications;
  for (const auto& [id, group] : groups_) {
    const bool active = !group->members.empty() || group->resources != nullptr;
    if (group->scopeKey == scopeKey && active) specifications.push_back(group->specification);
  }
  return specifications;
}

void ResourceManager::shutdown() {
  if (!automaticCleanup_) return;
  closeGroups();
  automaticCleanup_ = false;
}

std::vector<GroupPtr> ResourceManager::groups() const {
  std::vector<GroupPtr> out;
  out.reserve(groups_.size());
  for (const auto& entry : groups_) out.push_back(entry.second);
  return out;
}

std::size_t ResourceManager::boundGroupCount() const {
  return static_cast<std::size_t>(std::count_if(
      groups_.begin(), groups_.end(), [](const auto& entry) { return entry.second->resources; }));
}

}  // namespace hmc::lifecycle
