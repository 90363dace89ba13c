#pragma once
// The execution-resource lifecycle manager: the reference's `_MulticoreResourceManager`,
// with the same semantics and messages.
//
// One manager per rank. The reference has one per process; with the `threads` transport a
// process holds many ranks, so managers are instantiable, and `current()` is the manager of
// the calling thread (set with ResourceManager::Scope), else the process's (ProcessScope: a
// program's world, hmc/world/world.hpp), else the process default.
//
// Collective methods (recycle, closeGroups, shutdown) must be called on every rank in the
// same order; they block until every rank arrives or the collective's deadline passes.
// Thread safety: a manager belongs to one rank thread; it is not safe to share.

#include <exception>
#include <functional>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/lifecycle/resource_group.hpp"
#include "hmc/record/recording.hpp"

namespace hmc::lifecycle {
namespace detail {
// The digest that the recycle agreement exchanges for a JSON value (FNV-1a over its type and
// contents, without dumping it): equal values give equal digests on every rank.
std::uint64_t digestOf(const nlohmann::json& value);
}  // namespace detail


// Stage tags of the manager's collectives.
inline constexpr std::string_view kRecycleStage = "recycle";
// Entered by every rank only after the digests of 'recycle' (or 'close validation') differed:
// the full manifests, for the mismatch diagnosis.
inline constexpr std::string_view kRecycleDiagnosisStage = "recycle diagnosis";
inline constexpr std::string_view kCloseDiagnosisStage = "close validation diagnosis";
inline constexpr std::string_view kCloseValidationStage = "close validation";
inline constexpr std::string_view kResourceCloseStage = "multicore resource close";
inline constexpr std::string_view kRuntimeReleaseStage = "multicore Runtime release";

// How 'recycle' agrees across ranks.
// - kDigest (the default): each rank sends a 64-bit digest of its (manifest, signature) and
//   its idle/compatible bits, 12 + 2 * ceil(groups / 8) bytes; the full manifests travel only
//   when the digests differ, to diagnose the mismatch (DESIGN.md, Scale).
// - kFullManifest: each rank sends its full manifest, signature and bits (CBOR) and compares
//   them with every peer's, as the reference does: bytes per rank grow with the groups and the
//   work per rank with ranks x groups. For benchmarks (lifecycle_bench) and cross-checks; the
//   results and error messages are the same.
enum class Agreement { kDigest, kFullManifest };

class ResourceManager {
 public:
  explicit ResourceManager(std::shared_ptr<collective::Collective> collective);
  ~ResourceManager();
  ResourceManager(const ResourceManager&) = delete;
  ResourceManager& operator=(const ResourceManager&) = delete;

  // The process-wide manager over a one-rank LocalCollective.
  static std::shared_ptr<ResourceManager> processDefault();
  // This thread's manager (innermost Scope), else the process's (ProcessScope), else the
  // process default.
  static std::shared_ptr<ResourceManager> current();

  // Makes `manager` this thread's current() until destroyed.
  class Scope {
   public:
    explicit Scope(std::shared_ptr<ResourceManager> manager);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::shared_ptr<ResourceManager> previous_;
  };

  // Makes `manager` current() for every thread of the process that has no Scope of its own,
  // until destroyed (then the previous one is again). One per world a program joins; made and
  // destroyed on one thread, in nested order.
  class ProcessScope {
   public:
    explicit ProcessScope(std::shared_ptr<ResourceManager> manager);
    ~ProcessScope();
    ProcessScope(const ProcessScope&) = delete;
    ProcessScope& operator=(const ProcessScope&) = delete;

   private:
    std::shared_ptr<ResourceManager> previous_;
  };

  collective::Collective& collective() noexcept { return *collective_; }

  // Local. A new unbound group with one member.
  std::pair<GroupPtr, MemberToken> createGroup(nlohmann::json specification,
                                               nlohmann::json compatibilityKey,
                                               nlohmann::json scopeKey);
  // Local.
  MemberToken addMember(ResourceGroup& group);
  // Local, never collective: drops a membership; a group with no members and no resources
  // is forgotten (closed).
  void retire(GroupId groupId, MemberToken memberToken);

  // Collective ('recycle'). Reconciles orphan groups on a first binding: the first bound
  // group idle on every rank and compatible with `target` on every rank (in binding order)
  // moves its resources to `target`; every other group idle on every rank is closed
  // collectively. Raises RuntimeError when ranks' manifests or signatures differ.
  void recycle(ResourceGroup& target, const Binding& binding, const nlohmann::json& signature);

  // Collective. Validates manifests and readiness across ranks, closes every bound group of
  // `groups` (all groups when nullopt) in binding order, forgets unbound ones, and releases
  // the runtime once no group holds resources. On failure ownership stays, so a retry with
  // the same manifest works.
  void closeGroups(std::optional<std::vector<GroupPtr>> groups = std::nullopt);

  // Specifications of the active (members or resources) groups in `scopeKey`.
  std::vector<nlohmann::json> activeSpecifications(const nlohmann::json& scopeKey) const;

  BindingId nextBindingId() noexcept { return nextBindingId_++; }

  // The process runtime's final release (set by the first binding's module type), called
  // once inside the 'multicore Runtime release' collective after the last group closes.
  const std::function<void()>& runtimeRelease() const noexcept { return runtimeRelease_; }
  void setRuntimeRelease(std::function<void()> release) { runtimeRelease_ = std::move(release); }

  // The reference's `_automatic.register(close_groups, ...)`: remember that shutdown() must
  // close groups. shutdown() is collective when registered; it never runs from a destructor.
  void registerAutomaticCleanup() noexcept { automaticCleanup_ = true; }
  bool automaticCleanupRegistered() const noexcept { return automaticCleanup_; }
  void shutdown();

  // The diagnosis of the last manifest or signature mismatch this manager raised: every
  // rank's manifest (and signature) and the first entry that differs from rank 0's. Cleared
  // by clearLastMismatch(); the scenario runner reports it.
  const std::optional<nlohmann::json>& lastMismatch() const noexcept { return lastMismatch_; }
  void clearLastMismatch() noexcept { lastMismatch_.reset(); }

  // The first failure of this rank's lifecycle calls, caught by the program or not: what the
  // world's end reports first (hmc/world/world.hpp, hmc/diagnostics/diagnosis.hpp). `op` is the
  // call ("forward", "close", "share", "close_all"), `sequenceAtCall` the collective's
  // sequence() when the call began: a call that entered no collective failed locally.
  struct NotedFailure {
    std::string op;
    std::string errorKind;  // the report's error kind ("runtime_error", "timeout", ...)
    std::string message;    // its first line
    std::string stage;      // the collective where it failed; "" for a local failure
    std::optional<std::uint64_t> sequence;
    std::uint64_t collectivesBefore = 0;
    std::optional<nlohmann::json> mismatch;  // lastMismatch(), for a manifest mismatch
  };
  // Called by the modules' calls and the manager's own close_all when they throw; keeps the
  // first and counts the rest. Never throws.
  void noteFailure(std::string_view op, const std::exception& error,
                   std::uint64_t sequenceAtCall) noexcept;
  // Called on the rank's thread once, right after the first failure is noted (a world writes
  // its heartbeat then: a rank that dies a moment later has said what it met). Set before the
  // rank's calls start; it must not throw.
  void onFirstFailure(std::function<void()> callback) { onFirstFailure_ = std::move(callback); }
  // Runs `call`, one of the rank's lifecycle calls (`op`), and notes its failure (noteFailure)
  // before the error goes on to the caller.
  template <class Fn>
  decltype(auto) noting(std::string_view op, Fn&& call) {
    const std::uint64_t before = collective_->sequence();
    try {
      return call();
    } catch (const std::exception& error) {
      noteFailure(op, error, before);
      throw;
    }
  }
  // What noteFailure would note for `error` (the scenario runner's steps), right after the
  // call that raised it.
  NotedFailure describeFailure(std::string_view op, const std::exception& error,
                               std::uint64_t sequenceAtCall) const;
  // A copy, safe to take on another thread (a world's signal thread) while the rank's thread
  // notes one.
  std::optional<NotedFailure> firstFailure() const {
    std::lock_guard<std::mutex> lock(failureMutex_);
    return firstFailure_;
  }
  std::uint64_t failureCount() const noexcept { return failureCount_; }

  // Local. Every rank must use the same agreement (the payloads differ). Default kDigest.
  void setAgreement(Agreement agreement) noexcept { agreement_ = agreement; }
  Agreement agreement() const noexcept { return agreement_; }

  // Introspection (local).
  // The rank's recording (hmc/record/recording.hpp): null (the default) records nothing.
  void setRecorder(std::shared_ptr<record::Recorder> recorder) noexcept {
    recorder_ = std::move(recorder);
  }
  record::Recorder* recorder() const noexcept { return recorder_.get(); }

  std::vector<GroupPtr> groups() const;
  std::size_t groupCount() const noexcept { return groups_.size(); }
  std::size_t boundGroupCount() const;

 private:
  static std::vector<GroupPtr> boundGroups(const std::vector<GroupPtr>& groups);
  static std::uint64_t manifestDigest(const std::vector<GroupPtr>& bound);
  void validateCollectiveClose(const std::vector<GroupPtr>& bound);
  void closeGroupCollectively(const GroupPtr& group);
  void releaseRuntime(const std::function<void()>& release);
  void closeSelected(std::optional<std::vector<GroupPtr>> requested);

  std::shared_ptr<collective::Collective> collective_;
  std::shared_ptr<record::Recorder> recorder_;
  GroupId nextGroupId_ = 0;
  MemberToken nextMemberToken_ = 0;
  BindingId nextBindingId_ = 0;
  std::map<GroupId, GroupPtr> groups_;  // ids only grow: map order is creation order
  std::function<void()> runtimeRelease_;
  bool runtimeReleased_ = false;
  bool automaticCleanup_ = false;
  std::optional<nlohmann::json> lastMismatch_;
  mutable std::mutex failureMutex_;  // firstFailure_, read by other threads
  std::optional<NotedFailure> firstFailure_;
  std::function<void()> onFirstFailure_;
  std::atomic<std::uint64_t> failureCount_{0};
  Agreement agreement_ = Agreement::kDigest;
};

}  // namespace hmc::lifecycle
