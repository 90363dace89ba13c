#include "hmc/torch/scratch_modules.hpp"

#include <torch/autograd.h>
#include <torch/nn/init.h>

#include "hmc/error.hpp"
#include "hmc/torch/dtype.hpp"

namespace hmc::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Keeps the workspace alive in the autograd graph while a backward is pending.
struct WorkspaceHolder : torch::CustomClassHolder {
  explicit WorkspaceHolder(std::shared_ptr<resources::HostWorkspace> ws) : workspace(std::move(ws)) {}
  std::shared_ptr<resources::HostWorkspace> workspace;
};

struct ScratchFn : public torch::autograd::Function<ScratchFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight,
                               std::shared_ptr<resources::HostWorkspace> workspace) {
    workspace->addPending();
    ctx->saved_data["workspace"] =
        c10::IValue::make_capsule(c10::make_intrusive<WorkspaceHolder>(std::move(workspace)));
    ctx->save_for_backward({x, weight});
    return x.matmul(weight);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto holder = c10::static_intrusive_pointer_cast<WorkspaceHolder>(
        ctx->saved_data["workspace"].toCapsule());
    holder->workspace->removePending();
    const torch::Tensor& grad = grads[0];
    return {grad.matmul(saved[1].t()), saved[0].t().matmul(grad), torch::Tensor()};
  }
};

nlohmann::json specificationOf(const std::string& kind, std::int64_t features,
                               std::int64_t workspaceBytes) {
  return {{"type", kind}, {"features", features}, {"workspace_bytes", workspaceBytes}};
}

MulticoreOptions baseOptions(const std::string& kind, const ScratchOptions& options) {
  const std::int64_t features = options.features;
  const std::int64_t bytes = options.workspaceBytes.value_or(features * features * 4);
  const nlohmann::json spec = specificationOf(kind, features, bytes);
  const nlohmann::json compat =
      options.compat && !options.compat->is_null() ? *options.compat : spec;
  // The reference keys on json.dumps(..., sort_keys=True): compare serialised text, so that
  // 1 and 1.0 stay different keys as they are there.
  return MulticoreOptions{spec.dump(), compat.dump(), options.scope, options.manager};
}

}  // namespace

ScratchModule::ScratchModule(std::string kind, ScratchOptions options)
    : MulticoreModule(baseOptions(kind, options)),
      kind_(std::move(kind)),
      features_(options.features),
      workspaceBytes_(options.workspaceBytes.value_or(options.features * options.features * 4)),
      resources_(options.resources ? std::move(options.resources) : defaultRankResources()) {
  if (features_ < 1) throw ValueError("features must be >= 1");
  if (workspaceBytes_ < 0) throw ValueError("workspace_bytes must be >= 0");
  weight_ = register_parameter("weight", torch::randn({features_, features_}) * 0.01);
}

std::shared_ptr<resources::RankResources> ScratchModule::defaultRankResources() {
  static const auto resources = std::make_shared<resources::RankResources>();
  return resources;
}

torch::Tensor ScratchModule::forward(const torch::Tensor& x) {
  auto resources = std::static_pointer_cast<resources::HostWorkspace>(getExecutionResources(x));
  return ScratchFn::apply(x, weight_.to(x.scalar_type()), std::move(resources));
}

resources::HostWorkspace* ScratchModule::workspace() const {
  return static_cast<resources::HostWorkspace*>(resourceGroup()->resources.get());
}

std::shared_ptr<lifecycle::Resource> ScratchModule::createExecutionResources(
    const torch::Tensor& tensor, bool shared,
    const std::vector<nlohmann::json>& activeSpecifications) {
  return std::make_shared<resources::HostWorkspace>(kind_, workspaceBytes_,
                                                    dtypeName(tensor.scalar_type()), resources_);
}

void ScratchModule::registerRuntimeRelease(lifecycle::ResourceManager& manager,
                                           lifecycle::Resource& resources) {
  manager.setRuntimeRelease(resources_->createRuntime());
}

ScratchLinear::ScratchLinear(ScratchOptions options)
    : ScratchModule("scratch_linear", std::move(options)) {}

ScratchMLP::ScratchMLP(ScratchOptions options) : ScratchModule("scratch_mlp", std::move(options)) {}

std::shared_ptr<ScratchModule> makeScratchModule(const std::string& type, ScratchOptions options) {
  if (type == "scratch_linear") return std::make_shared<ScratchLinear>(std::move(options));
  if (type == "scratch_mlp") return std::make_shared<ScratchMLP>(std::move(options));
  return nullptr;
}

}  // namespace hmc::nn
