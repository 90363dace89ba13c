#pragma once
// MulticoreModule: the base class of Torch modules that lazily own multicore execution
// resources (the reference's `MulticoreModule`). Namespace hmc::nn (not hmc::torch, which
// would hide ::torch inside hmc).
//
// Construction creates an unbound resource group in the current rank's ResourceManager.
// The first getExecutionResources(tensor) binds the group to the tensor's device and dtype:
// it recycles an idle compatible group (collective 'recycle') or creates resources. The
// destructor retires the membership (local, never a collective). close() is collective when
// it closes the last member's bound group.

#include <torch/nn/module.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/lifecycle/resource_manager.hpp"

namespace hmc::nn {

struct MulticoreOptions {
  nlohmann::json specification;
  nlohmann::json compatibilityKey;
  nlohmann::json scopeKey;
  // The rank's manager; null means ResourceManager::current().
  std::shared_ptr<lifecycle::ResourceManager> manager;
  // The module's name in the manager's recording (hmc/record/recording.hpp); empty: "m<N>",
  // N its creation order on the rank.
  std::string name;
};

// How the last first-binding went (what the report's `bind` section shows).
struct BindInfo {
  lifecycle::BindingId bindingId = 0;
  bool reused = false;  // the resources came from a recycled group
  std::chrono::duration<double> seconds{0};
};

class MulticoreModule : public torch::nn::Module {
 public:
  explicit MulticoreModule(MulticoreOptions options);
  ~MulticoreModule() override;

  // Puts `modules` into the first module's group so that they bind one set of resources.
  // Local. All must be unbound, ungrouped, of one concrete type and one configuration.
  // Throws ValueError / TypeError / RuntimeError with the reference's messages.
  static void shareExecutionResources(const std::vector<MulticoreModule*>& modules);
  // The same with an isinstance check against `Cls` (the reference's `cls`), named
  // `className` in the TypeError.
  template <class Cls>
  static void shareExecutionResourcesAs(const std::vector<MulticoreModule*>& modules,
                                        std::string_view className) {
    shareImpl(modules, className,
              [](const MulticoreModule& m) { return dynamic_cast<const Cls*>(&m) != nullptr; });
  }

  // Closes this module: collective when this is the last member of a bound group (closes
  // it, and releases the runtime after the last group); after a failure, call again.
  void close();

  // The concrete type's name (`type(self).__name__`), and its namespace (`__module__`).
  virtual std::string typeName() const = 0;
  virtual std::string typeNamespace() const { return "hmc.nn"; }

  const lifecycle::GroupPtr& resourceGroup() const noexcept { return group_; }
  lifecycle::ResourceManager& manager() const noexcept { return *manager_; }
  bool isClosed() const noexcept { return closed_; }
  // Set by the getExecutionResources call that bound the group; reset by every later call.
  const std::optional<BindInfo>& lastBind() const noexcept { return lastBind_; }
  // The module's index in its manager's recording (-1: not recorded).
  std::int32_t recordIndex() const noexcept { return recordIndex_; }

 protected:
  // The group's resources, bound on first use (see the class comment). Throws
  // RuntimeError on a closed or closing module, ValueError on another device/dtype,
  // TypeError on an undefined tensor.
  std::shared_ptr<lifecycle::Resource> getExecutionResources(const torch::Tensor& tensor);

  // Rank-independent signature compared across ranks on binding: type and dtype.
  virtual nlohmann::json resourceSignature(const torch::Tensor& tensor) const;
  // Optionally registers the runtime's final release with `manager`.
  virtual void registerRuntimeRelease(lifecycle::ResourceManager& manager,
                                      lifecycle::Resource& resources) {}
  virtual std::shared_ptr<lifecycle::Resource> createExecutionResources(
      const torch::Tensor& tensor, bool shared,
      const std::vector<nlohmann::json>& activeSpecifications) = 0;

  static lifecycle::Binding executionBinding(const torch::Tensor& tensor);

 private:
  // getExecutionResources without noting its failure: the recording's event, then the bind.
  std::shared_ptr<lifecycle::Resource> recordedBind(const torch::Tensor& tensor);
  static void shareImpl(const std::vector<MulticoreModule*>& members, std::string_view className,
                        const std::function<bool(const MulticoreModule&)>& isInstance);
  static void shareChecked(const std::vector<MulticoreModule*>& members,
                           std::string_view className,
                           const std::function<bool(const MulticoreModule&)>& isInstance);
  void closeOnce();
  void moveToResourceGroup(const lifecycle::GroupPtr& target);
  std::shared_ptr<lifecycle::Resource> bindOrReuse(const torch::Tensor& tensor);
  // The manager's recorder when this module is recorded (null: not recorded); the first call
  // records the module's concrete type.
  record::Recorder* recorder();

  std::shared_ptr<lifecycle::ResourceManager> manager_;
  lifecycle::GroupPtr group_;
  lifecycle::MemberToken memberToken_ = 0;
  bool closed_ = false;
  bool finalizerAttached_ = true;
  std::optional<BindInfo> lastBind_;
  std::int32_t recordIndex_ = -1;  // the module's index in the recording (-1: none)
};

}  // namespace hmc::nn
