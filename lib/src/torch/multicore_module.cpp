#include "hmc/torch/multicore_module.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>
#include <typeindex>

#include "hmc/error.hpp"
#include "hmc/torch/dtype.hpp"

namespace hmc::nn {

using lifecycle::GroupPtr;

MulticoreModule::MulticoreModule(MulticoreOptions options)
    : manager_(options.manager ? std::move(options.manager)
                               : lifecycle::ResourceManager::current()) {
  if (record::Recorder* recorder = manager_->recorder()) {
    recordIndex_ = recorder->create(options.name, options.specification, options.compatibilityKey,
                                    options.scopeKey);
  }
  auto [group, token] =
      manager_->createGroup(std::move(options.specification), std::move(options.compatibilityKey),
                            std::move(options.scopeKey));
  group_ = std::move(group);
  memberToken_ = token;
}

MulticoreModule::~MulticoreModule() {
  // Not recorder(): the concrete type is already destroyed here.
  record::Recorder* recorder = recordIndex_ >= 0 ? manager_->recorder() : nullptr;
  if (recorder != nullptr) {
    recorder->append(record::EventOp::kDrop, recordIndex_, record::Outcome::kOk,
                     std::chrono::nanoseconds(0));
  }
  if (finalizerAttached_) manager_->retire(group_->identifier, memberToken_);
}

record::Recorder* MulticoreModule::recorder() {
  if (recordIndex_ < 0) return nullptr;
  record::Recorder* recorder = manager_->recorder();
  if (recorder != nullptr && !recorder->typeKnown(recordIndex_)) {
    recorder->setType(recordIndex_, typeNamespace(), typeName());
  }
  return recorder;
}

void MulticoreModule::shareExecutionResources(const std::vector<MulticoreModule*>& modules) {
  shareImpl(modules, "MulticoreModule", [](const MulticoreModule&) { return true; });
}

void MulticoreModule::shareImpl(const std::vector<MulticoreModule*>& members,
                                std::string_view className,
                                const std::function<bool(const MulticoreModule&)>& isInstance) {
  record::Recorder* recorder = members.empty() ? nullptr : members.front()->recorder();
  nlohmann::json names = nlohmann::json::array();
  if (recorder != nullptr) {
    for (MulticoreModule* member : members) {
      member->recorder();  // its type, before the event
      names.push_back(member->recordIndex_);
    }
  }
  const auto share = [&] {
    record::recordCall(recorder, record::EventOp::kShare,
                       recorder ? members.front()->recordIndex_ : -1,
                       [&] { shareChecked(members, className, isInstance); }, {{"modules", names}});
  };
  if (members.empty()) return share();  // shareChecked's error: no manager to note it in
  members.front()->manager_->noting("share", share);
}

void MulticoreModule::shareChecked(const std::vector<MulticoreModule*>& members,
                                   std::string_view className,
                                   const std::function<bool(const MulticoreModule&)>& isInstance) {
  // _validate_shared_members
  if (members.empty()) {
    throw ValueError("shared multicore execution requires at least one module.");
  }
  if (std::set<const MulticoreModule*>(members.begin(), members.end()).size() != members.size()) {
    throw ValueError("shared multicore execution cannot contain duplicate modules.");
  }
  bool allInstances = true;
  for (const MulticoreModule* member : members) allInstances = allInstances && isInstance(*member);
  if (!allInstances) {
    std::vector<std::string> actual;
    for (const MulticoreModule* member : members) {
      actual.push_back(fmt::format("'{}'", member->typeName()));
    }
    throw TypeError(fmt::format("all shared modules must be {} instances, got [{}].", className,
                                fmt::join(actual, ", ")));
  }
  for (const MulticoreModule* member : members) {
    if (member->closed_ || member->group_->closed) {
      throw RuntimeError("closed multicore modules cannot share execution resources.");
    }
  }
  for (const MulticoreModule* member : members) {
    if (member->group_->closing) {
      throw RuntimeError("closing multicore modules cannot share execution resources.");
    }
  }
  std::set<std::type_index> concreteTypes;
  for (const MulticoreModule* member : members) concreteTypes.insert(typeid(*member));
  if (concreteTypes.size() != 1) {
    throw TypeError("shared multicore execution requires one concrete module type.");
  }
  const GroupPtr firstGroup = members.front()->group_;

  bool alreadyShared = true;
  for (const MulticoreModule* member : members) {
    alreadyShared = alreadyShared && member->group_ == firstGroup;
  }
  if (alreadyShared) return;

  // _validate_unbound_groups
  for (const MulticoreModule* member : members) {
    const GroupPtr& group = member->group_;
    if (group->compatibilityKey != firstGroup->compatibilityKey) {
      throw ValueError("shared multicore modules must have identical configuration and scope.");
    }
    if (group->resources || group->binding || group->members.size() != 1) {
      throw RuntimeError(
          "execution resources must be shared before first use or previous grouping.");
    }
  }
  firstGroup->shared = true;
  for (std::size_t i = 1; i < members.size(); ++i) members[i]->moveToResourceGroup(firstGroup);
}

void MulticoreModule::moveToResourceGroup(const GroupPtr& target) {
  const GroupPtr oldGroup = group_;
  finalizerAttached_ = false;
  manager_->retire(oldGroup->identifier, memberToken_);
  memberToken_ = manager_->addMember(*target);
  group_ = target;
  finalizerAttached_ = true;
}

std::shared_ptr<lifecycle::Resource> MulticoreModule::getExecutionResources(
    const torch::Tensor& tensor) {
  return manager_->noting("forward", [&] { return recordedBind(tensor); });
}

std::shared_ptr<lifecycle::Resource> MulticoreModule::recordedBind(const torch::Tensor& tensor) {
  record::Recorder* recorder = this->recorder();
  if (recorder == nullptr) return bindOrReuse(tensor);
  const auto start = std::chrono::steady_clock::now();
  try {
    auto resources = bindOrReuse(tensor);
    const auto ended = std::chrono::steady_clock::now();
    const auto took = ended - start;
    if (lastBind_) {
      recorder->bound(recordIndex_, took, group_->binding->device, group_->binding->dtype,
                      lastBind_->reused, ended);
    } else {
      recorder->append(record::EventOp::kForward, recordIndex_, record::Outcome::kOk, took);
    }
    return resources;
  } catch (const std::exception& error) {
    nlohmann::json detail = record::errorDetail(error);
    if (tensor.defined()) {
      detail["device"] = tensor.device().str();
      detail["dtype"] = dtypeName(tensor.scalar_type());
    }
    recorder->append(record::EventOp::kForward, recordIndex_, record::outcomeOf(error),
                     std::chrono::steady_clock::now() - start, detail);
    throw;
  }
}

std::shared_ptr<lifecycle::Resource> MulticoreModule::bindOrReuse(const torch::Tensor& tensor) {
  if (closed_ || group_->closed) {
    throw RuntimeError("cannot execute a closed multicore module.");
  }
  if (group_->closing) {
    throw RuntimeError("cannot execute a closing multicore module; finish cleanup before reuse.");
  }
  lastBind_.reset();
  const GroupPtr group = group_;
  const lifecycle::Binding binding = executionBinding(tensor);
  if (!group->resources) {
    const auto start = std::chrono::steady_clock::now();
    group->moduleType = typeNamespace() + "." + typeName();
    manager_->registerAutomaticCleanup();
    manager_->recycle(*group, binding, resourceSignature(tensor));
    const bool reused = group->resources != nullptr;
    if (!group->resources) {
      const std::vector<nlohmann::json> activeSpecs =
          manager_->activeSpecifications(group->scopeKey);
      group->resources = createExecutionResources(tensor, group->shared, activeSpecs);
      group->binding = binding;
      group->bindingId = manager_->nextBindingId();
      if (!manager_->runtimeRelease()) registerRuntimeRelease(*manager_, *group->resources);
    }
    lastBind_ = BindInfo{*group->bindingId, reused, std::chrono::steady_clock::now() - start};
  } else if (binding != *group->binding) {
    throw ValueError(
        fmt::format("multicore resources are bound to the first input device/dtype {}, got {}.",
                    group->binding->repr(), binding.repr()));
  }
  return group->resources;
}

nlohmann::json MulticoreModule::resourceSignature(const torch::Tensor& tensor) const {
  return nlohmann::json::array(
      {typeNamespace(), typeName(), "torch." + dtypeName(tensor.scalar_type())});
}

lifecycle::Binding MulticoreModule::executionBinding(const torch::Tensor& tensor) {
  if (!tensor.defined()) {
    throw TypeError("multicore modules require a Torch tensor input.");
  }
  return lifecycle::Binding{tensor.device().str(), dtypeName(tensor.scalar_type())};
}

void MulticoreModule::close() {
  manager_->noting("close", [&] {
    record::recordCall(recorder(), record::EventOp::kClose, recordIndex_, [&] { closeOnce(); });
  });
}

void MulticoreModule::closeOnce() {
  if (closed_) return;
  const GroupPtr group = group_;
  if (group->resources && group->members == std::set<lifecycle::MemberToken>{memberToken_}) {
    manager_->closeGroups(std::vector<GroupPtr>{group});
  } else if (group->closed) {
    // A previous attempt may have freed buffers but failed the final runtime release.
    manager_->closeGroups(std::vector<GroupPtr>{});
  } else {
    manager_->retire(group->identifier, memberToken_);
  }
  closed_ = true;
  finalizerAttached_ = false;
}

}  // namespace hmc::nn
