#include "hmc/lifecycle/resource_manager.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <utility>

#include "hmc/error.hpp"

namespace hmc::lifecycle {
namespace detail {

constexpr std::uint64_t kDigestSeed = 1469598103934665603ULL;  // FNV-1a offset basis

std::uint64_t mixBytes(std::uint64_t digest, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    digest ^= bytes[i];
    digest *= 1099511628211ULL;  // FNV-1a prime
  }
  return digest;
}

std::uint64_t mix(std::uint64_t digest, std::uint64_t value) {
  return mixBytes(digest, &value, sizeof value);
}

namespace {

std::uint64_t mixText(std::uint64_t digest, const std::string& text) {
  return mixBytes(mix(digest, text.size()), text.data(), text.size());
}

// Walks the value instead of dumping it (a dump allocates its text and a 512-byte indent
// string on every cycle's recycle). Two values get one digest exactly when their CBOR, which
// the full-manifest agreement compares byte for byte, is the same (up to FNV-1a collisions):
// each value mixes its type, then its contents, and strings and containers mix their size
// first, so 1, 1.0, true and "1" differ, as do ["ab","c"] and ["a","bc"]. As in CBOR, a
// non-negative integer is one number whether signed or not, every NaN is one NaN, and -0.0
// differs from 0.0.
std::uint64_t walk(std::uint64_t digest, const nlohmann::json& value) {
  using value_t = nlohmann::json::value_t;
  value_t type = value.type();
  if (type == value_t::number_integer && value.get<std::int64_t>() >= 0) {
    type = value_t::number_unsigned;
  }
  digest = mix(digest, static_cast<std::uint64_t>(type));
  switch (type) {
    case value_t::boolean:
      return mix(digest, value.get<bool>() ? 1 : 0);
    case value_t::number_integer:
      return mix(digest, static_cast<std::uint64_t>(value.get<std::int64_t>()));
    case value_t::number_unsigned:
      return mix(digest, value.get<std::uint64_t>());
    case value_t::number_float: {
      const double number = std::isnan(value.get<double>())
                                ? std::numeric_limits<double>::quiet_NaN()
                                : value.get<double>();
      return mixBytes(digest, &number, sizeof number);
    }
    case value_t::string:
      return mixText(digest, value.get_ref<const std::string&>());
    case value_t::binary: {
      const auto& binary = value.get_binary();
      digest = mix(mix(digest, binary.has_subtype() ? binary.subtype() + 1 : 0), binary.size());
      return mixBytes(digest, binary.data(), binary.size());
    }
    case value_t::array:
      digest = mix(digest, value.size());
      for (const nlohmann::json& element : value) digest = walk(digest, element);
      return digest;
    case value_t::object:
      digest = mix(digest, value.size());
      for (auto it = value.begin(); it != value.end(); ++it) {
        digest = walk(mixText(digest, it.key()), it.value());
      }
      return digest;
    case value_t::null:
    case value_t::discarded:
      return digest;
  }
  return digest;
}

}  // namespace

std::uint64_t digestOf(const nlohmann::json& value) { return walk(kDigestSeed, value); }

// u64 digest | u32 count | for each bit vector: count bits, packed.
collective::Bytes encodeStates(std::uint64_t digest,
                               std::initializer_list<const std::vector<bool>*> bits) {
  const std::uint32_t count = static_cast<std::uint32_t>((*bits.begin())->size());
  collective::Bytes out(12, '\0');
  std::memcpy(out.data(), &digest, 8);
  std::memcpy(out.data() + 8, &count, 4);
  for (const std::vector<bool>* vector : bits) {
    std::string packed((count + 7) / 8, '\0');
    for (std::uint32_t i = 0; i < count; ++i) {
      if ((*vector)[i]) packed[i / 8] = static_cast<char>(packed[i / 8] | (1 << (i % 8)));
    }
    out += packed;
  }
  return out;
}

// ANDs a peer's bits into `bits`; false when the peer's digest (or size) differs.
bool andStates(const collective::Bytes& peer, std::uint64_t digest,
               std::initializer_list<std::vector<bool>*> bits) {
  std::uint64_t peerDigest = 0;
  std::uint32_t count = 0;
  if (peer.size() < 12) return false;
  std::memcpy(&peerDigest, peer.data(), 8);
  std::memcpy(&count, peer.data() + 8, 4);
  const std::size_t stride = (count + 7) / 8;
  if (peerDigest != digest || count != (*bits.begin())->size() ||
      peer.size() != 12 + stride * bits.size()) {
    return false;
  }
  std::size_t offset = 12;
  for (std::vector<bool>* vector : bits) {
    for (std::uint32_t i = 0; i < count; ++i) {
      const bool bit = (peer[offset + i / 8] >> (i % 8)) & 1;
      (*vector)[i] = (*vector)[i] && bit;
    }
    offset += stride;
  }
  return true;
}

// Reduces every rank's encodeStates payload: "A" + the first payload with every peer's bits
// ANDed in, when every digest and count equals the first's; else "D". Runs once per
// collective with the threads transport (Collective::exchangeReduced).
collective::Bytes reduceStates(const std::vector<collective::Bytes>& peers) {
  const collective::Bytes& first = peers.front();
  if (first.size() < 12) return "D";
  collective::Bytes out = "A" + first;
  for (const collective::Bytes& peer : peers) {
    if (peer.size() != first.size() || peer.compare(0, 12, first, 0, 12) != 0) return "D";
    for (std::size_t i = 12; i < peer.size(); ++i) {
      out[1 + i] = static_cast<char>(out[1 + i] & peer[i]);
    }
  }
  return out;
}

}  // namespace detail

namespace {

using nlohmann::json;

thread_local std::shared_ptr<ResourceManager> tCurrent;
// ProcessScope's manager; read under its mutex (once per module construction).
std::mutex gProcessMutex;
std::shared_ptr<ResourceManager> gProcessCurrent;

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
      first = {{"rank", rank},
               {"signature", true},
               {"rank0", reference.at(1)},
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
  if (tCurrent) return tCurrent;
  {
    std::lock_guard<std::mutex> guard(gProcessMutex);
    if (gProcessCurrent) return gProcessCurrent;
  }
  return processDefault();
}

ResourceManager::ProcessScope::ProcessScope(std::shared_ptr<ResourceManager> manager) {
  std::lock_guard<std::mutex> guard(gProcessMutex);
  previous_ = std::exchange(gProcessCurrent, std::move(manager));
}

ResourceManager::ProcessScope::~ProcessScope() {
  std::lock_guard<std::mutex> guard(gProcessMutex);
  gProcessCurrent = std::move(previous_);
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
  const auto targetKey =
      std::tie(target.compatibilityKey, target.scopeKey, target.shared, target.moduleType);
  std::vector<bool> idle(bound.size());
  std::vector<bool> compatible(bound.size());
  for (std::size_t i = 0; i < bound.size(); ++i) {
    const GroupPtr& group = bound[i];
    idle[i] = group->members.empty() && !group->closing && group->resources->canClose();
    compatible[i] = std::tie(group->compatibilityKey, group->scopeKey, group->shared,
                             group->moduleType) == targetKey &&
                    group->binding == binding;
  }
  std::vector<bool> idleEverywhere = idle;
  std::vector<bool> compatibleEverywhere = compatible;
  auto statesOf = [&] {
    json states = json::array();
    for (std::size_t i = 0; i < bound.size(); ++i) {
      states.push_back(json::array({static_cast<bool>(idle[i]), static_cast<bool>(compatible[i])}));
    }
    return states;
  };
  if (agreement_ == Agreement::kFullManifest) {
    // The reference's way: every rank's full manifest and signature travel and each rank
    // compares them (byte for byte, their CBOR) with its own; then the state bits.
    // Payload: u32 size | CBOR [manifest, signature] | encodeStates(0, idle, compatible).
    const collective::Bytes manifest = encode(json::array({manifestOf(bound), signature}));
    const auto manifestSize = static_cast<std::uint32_t>(manifest.size());
    collective::Bytes payload(4, '\0');
    std::memcpy(payload.data(), &manifestSize, 4);
    payload += manifest;
    payload += detail::encodeStates(0, {&idle, &compatible});
    const collective::SharedPayloads peers = collective_->exchangeShared(kRecycleStage, payload);
    bool agreed = true;
    for (const auto& peer : *peers) {
      agreed = agreed && peer.size() >= 4 + manifest.size() &&
               peer.compare(0, 4 + manifest.size(), payload, 0, 4 + manifest.size()) == 0 &&
               detail::andStates(peer.substr(4 + manifest.size()), 0,
                                 {&idleEverywhere, &compatibleEverywhere});
      if (!agreed) break;
    }
    if (!agreed) {
      std::vector<json> all;
      for (const auto& peer : *peers) {
        std::uint32_t size = 0;
        if (peer.size() >= 4) std::memcpy(&size, peer.data(), 4);
        all.push_back(json::from_cbor(peer.substr(4, size)));
      }
      lastMismatch_ = describeMismatch(kRecycleStage, all, true);
      throw RuntimeError("multicore resource binding order or specifications differ across ranks");
    }
  } else {
    // Fast path (DESIGN.md, Scale): agree on a digest of (manifest, signature) and the state
    // bits; the full manifests travel only when the digests differ, to diagnose the mismatch.
    const std::uint64_t digest = detail::mix(manifestDigest(bound), detail::digestOf(signature));
    // The AND over every rank's bits runs once per collective (exchangeReduced), not per rank.
    const collective::Bytes reduced = collective_->exchangeReduced(
        kRecycleStage, detail::encodeStates(digest, {&idle, &compatible}), detail::reduceStates);
    const bool agreed =
        reduced[0] == 'A' &&
        detail::andStates(reduced.substr(1), digest, {&idleEverywhere, &compatibleEverywhere});
    if (!agreed) {
      const json mine = json::array({manifestOf(bound), signature, statesOf()});
      const std::vector<json> all =
          decodeAll(*collective_->exchangeShared(kRecycleDiagnosisStage, encode(mine)));
      lastMismatch_ = describeMismatch(kRecycleStage, all, true);
      throw RuntimeError("multicore resource binding order or specifications differ across ranks");
    }
  }
  GroupPtr reusable;
  for (std::size_t index = 0; index < bound.size(); ++index) {
    if (!idleEverywhere[index]) continue;
    if (!reusable && compatibleEverywhere[index]) {
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
  // Every group: the program's close_all (a module's close() names its group, and notes its
  // own failure).
  if (requested) return closeSelected(std::move(requested));
  noting("close_all", [&] {
    record::recordCall(recorder_.get(), record::EventOp::kCloseAll, -1,
                       [&] { closeSelected(std::nullopt); });
  });
}

void ResourceManager::noteFailure(std::string_view op, const std::exception& error,
                                  std::uint64_t sequenceAtCall) noexcept {
  ++failureCount_;
  try {
    {
      std::lock_guard<std::mutex> lock(failureMutex_);
      if (firstFailure_) return;
      firstFailure_ = describeFailure(op, error, sequenceAtCall);
    }
    if (onFirstFailure_) onFirstFailure_();
  } catch (...) {
    // Out of memory while noting: the failure itself still reaches the caller.
  }
}

ResourceManager::NotedFailure ResourceManager::describeFailure(
    std::string_view op, const std::exception& error, std::uint64_t sequenceAtCall) const {
  NotedFailure failure;
  failure.op = std::string(op);
  failure.errorKind = std::string(toString(kindOf(error)));
  failure.message = error.what();
  failure.message = failure.message.substr(0, failure.message.find('\n'));
  failure.collectivesBefore = sequenceAtCall;
  const std::uint64_t now = collective_->sequence();
  if (now > sequenceAtCall) {
    const std::string& stage = collective_->lastStage();
    const bool diagnosed =
        lastMismatch_ && (stage == kCloseDiagnosisStage || stage == kRecycleDiagnosisStage);
    if (diagnosed && now >= sequenceAtCall + 2) {
      // The digests' collective found it; the diagnosis exchange after it said where.
      failure.stage = lastMismatch_->value("stage", std::string(stage));
      failure.sequence = now - 2;
      failure.mismatch = *lastMismatch_;
    } else {
      failure.stage = stage;
      failure.sequence = now - 1;
    }
  }
  return failure;
}

void ResourceManager::closeSelected(std::optional<std::vector<GroupPtr>> requested) {
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
    record::recordCall(recorder_.get(), record::EventOp::kRelease, -1, [&] {
      collective_->collectiveCall(kRuntimeReleaseStage, [&] { releaseRuntime(release); });
    });
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
  const bool ready = std::all_of(bound.begin(), bound.end(), [](const GroupPtr& group) {
    return group->resources->canClose();
  });
  const std::uint64_t digest = manifestDigest(bound);
  std::vector<bool> readyBits{ready};
  const collective::Bytes reduced = collective_->exchangeReduced(
      kCloseValidationStage, detail::encodeStates(digest, {&readyBits}), detail::reduceStates);
  std::vector<bool> readyEverywhere = readyBits;
  const bool agreed =
      reduced[0] == 'A' && detail::andStates(reduced.substr(1), digest, {&readyEverywhere});
  if (!agreed) {
    const std::vector<json> all = decodeAll(*collective_->exchangeShared(
        kCloseDiagnosisStage, encode(json::array({manifestOf(bound), ready}))));
    lastMismatch_ = describeMismatch(kCloseValidationStage, all, false);
    throw RuntimeError("multicore resource manifests differ across ranks");
  }
  if (!readyEverywhere[0]) {
    throw RuntimeError("multicore cleanup requires idle workspaces and no pending backward graphs");
  }
}

std::uint64_t ResourceManager::manifestDigest(const std::vector<GroupPtr>& bound) {
  std::uint64_t digest = detail::kDigestSeed;
  for (const GroupPtr& group : bound) {
    if (group->digestOf != group->resources.get()) {
      group->signatureDigest = detail::digestOf(group->resources->lifecycleSignature());
      group->digestOf = group->resources.get();
    }
    digest = detail::mix(detail::mix(digest, static_cast<std::uint64_t>(*group->bindingId)),
                         group->signatureDigest);
  }
  return detail::mix(digest, bound.size());
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
  // The automatic cleanup at a rank's end is not a call of the program: not recorded as a
  // close_all (a replay runs its own).
  closeSelected(std::nullopt);
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
