#include "hmc/torch/scratch_modules.hpp"

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/nn/init.h>

#include <algorithm>

#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/torch/dtype.hpp"
#if HMC_HAVE_CUDA
#include "cuda_stream_compat.hpp"
#include "hmc/resources/cuda_workspace.hpp"
#include "hmc/resources/nccl_runtime.hpp"
#endif

namespace hmc::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Keeps the workspace alive in the autograd graph while a backward is pending.
template <class Workspace>
struct WorkspaceHolder : torch::CustomClassHolder {
  explicit WorkspaceHolder(std::shared_ptr<Workspace> ws) : workspace(std::move(ws)) {}
  std::shared_ptr<Workspace> workspace;
};

// x @ weight through the workspace. On the host the workspace only holds the pending count.
torch::Tensor scratchMatmul(resources::HostWorkspace&, const torch::Tensor& x,
                            const torch::Tensor& weight) {
  return x.matmul(weight);
}

#if HMC_HAVE_CUDA
// On CUDA the input is staged into the workspace on its stream (ordered after LibTorch's
// current stream, which then waits for the copy) and the product reads it from there; the
// workspace then tracks the product, so canClose() stays false until it has run.
torch::Tensor scratchMatmul(resources::CudaWorkspace& workspace, const torch::Tensor& x,
                            const torch::Tensor& weight) {
  CUstream_st* stream = detail::currentCudaStream(x.device());
  const torch::Tensor input = x.contiguous();
  const auto bytes = static_cast<std::int64_t>(input.numel() * input.element_size());
  torch::Tensor result;
  if (bytes <= workspace.nbytes() && bytes > 0) {
    workspace.copyIn(input.data_ptr(), static_cast<std::size_t>(bytes), stream);
    const torch::Tensor staged = torch::from_blob(workspace.data(), input.sizes(), input.options());
    result = staged.matmul(weight);
  } else {
    // A workspace smaller than the input still takes the first nbytes() of it.
    const std::int64_t staged = std::min(bytes, workspace.nbytes());
    workspace.copyIn(input.data_ptr(), static_cast<std::size_t>(staged), stream);
    result = input.matmul(weight);
  }
  workspace.trackWorkOn(stream);
  return result;
}
#endif

template <class Workspace>
struct ScratchFn : public torch::autograd::Function<ScratchFn<Workspace>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, std::shared_ptr<Workspace> workspace) {
    // Counted before the product, as the reference runner's ScratchFn does: a forward that
    // raises (float16 matmul on CPU in LibTorch 1.13) leaves its pending count behind, and
    // the workspace can no longer close, exactly as there.
    workspace->addPending();
    torch::Tensor result = scratchMatmul(*workspace, x, weight);
    ctx->saved_data["workspace"] = c10::IValue::make_capsule(
        c10::make_intrusive<WorkspaceHolder<Workspace>>(std::move(workspace)));
    ctx->save_for_backward({x, weight});
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto holder = c10::static_intrusive_pointer_cast<WorkspaceHolder<Workspace>>(
        ctx->saved_data["workspace"].toCapsule());
    holder->workspace->removePending();
    const torch::Tensor& grad = grads[0];
    return {grad.matmul(saved[1].t()), saved[0].t().matmul(grad), torch::Tensor()};
  }
};

MulticoreOptions baseOptions(const std::string& kind, const ScratchOptions& options) {
  const std::int64_t features = options.features;
  const std::int64_t bytes = options.workspaceBytes.value_or(features * features * 4);
  // The reference keys on json.dumps(..., sort_keys=True): compare serialised text, so that
  // 1 and 1.0 stay different keys as they are there.
  std::string spec = detail::specificationText(kind, features, bytes);
  std::string compat =
      options.compat && !options.compat->is_null() ? options.compat->dump() : spec;
  return MulticoreOptions{std::move(spec), std::move(compat), options.scope, options.manager,
                          options.name};
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
  std::shared_ptr<lifecycle::Resource> bound = getExecutionResources(x);
  const torch::Tensor weight = weight_.to(x.device(), x.scalar_type());
#if HMC_HAVE_CUDA
  if (auto cuda = std::dynamic_pointer_cast<resources::CudaWorkspace>(bound)) {
    torch::Tensor result = ScratchFn<resources::CudaWorkspace>::apply(x, weight, cuda);
    // With more than one GPU: an NCCL all-reduce over the workspace, queued on its stream
    // after the product, so canClose() stays false until it has run on every rank.
    const std::shared_ptr<resources::NcclRuntime>& nccl = resources_->ncclRuntime();
    if (nccl && !nccl->released() && nccl->worldSize() > 1 && nccl->device() == cuda->device() &&
        cuda->nbytes() > 0) {
      cuda->trackWorkOn(detail::currentCudaStream(x.device()));
      nccl->allReduceBytes(cuda->data(), static_cast<std::size_t>(cuda->nbytes()), cuda->stream());
      cuda->recordWork();
    }
    return result;
  }
#endif
  auto host = std::static_pointer_cast<resources::HostWorkspace>(std::move(bound));
  return ScratchFn<resources::HostWorkspace>::apply(x, weight, std::move(host));
}

resources::HostWorkspace* ScratchModule::workspace() const {
  return dynamic_cast<resources::HostWorkspace*>(resourceGroup()->resources.get());
}

resources::CudaWorkspace* ScratchModule::cudaWorkspace() const {
#if HMC_HAVE_CUDA
  return dynamic_cast<resources::CudaWorkspace*>(resourceGroup()->resources.get());
#else
  return nullptr;
#endif
}

std::shared_ptr<lifecycle::Resource> ScratchModule::createExecutionResources(
    const torch::Tensor& tensor, bool shared,
    const std::vector<nlohmann::json>& activeSpecifications) {
  if (tensor.is_cuda()) {
#if HMC_HAVE_CUDA
    resources::CudaWorkspaceOptions options;
    options.kind = kind_;
    options.nbytes = workspaceBytes_;
    options.dtype = dtypeName(tensor.scalar_type());
    options.device = tensor.device().index();
    if (resources_->rank() >= 0) {
      options.owner = fmt::format("rank {} {} cuda:{}", resources_->rank(), kind_, options.device);
    }
    return std::make_shared<resources::CudaWorkspace>(std::move(options), resources_);
#else
    throw BackendError(resources::kBuiltWithoutCuda);
#endif
  }
  return std::make_shared<resources::HostWorkspace>(kind_, workspaceBytes_,
                                                    dtypeName(tensor.scalar_type()), resources_);
}

void ScratchModule::registerRuntimeRelease(lifecycle::ResourceManager& manager,
                                           lifecycle::Resource& resources) {
#if HMC_HAVE_CUDA
  // The process runtime on GPU: an NCCL communicator over the world, made (collectively)
  // before the host runtime so that a failure leaves nothing registered.
  std::shared_ptr<resources::NcclRuntime> nccl;
  auto* cuda = dynamic_cast<resources::CudaWorkspace*>(&resources);
  if (cuda != nullptr && resources_->ncclRuntimeFactory()) {
    nccl = resources_->ncclRuntimeFactory()(cuda->device());
  }
  std::function<void()> hostRelease = resources_->createRuntime();
  if (!nccl) {
    manager.setRuntimeRelease(std::move(hostRelease));
    return;
  }
  resources_->setNcclRuntime(nccl);
  // The manager calls this once per rank inside 'multicore Runtime release' and again on a
  // rank whose call threw, on the retry. The NCCL release runs first and once: it is
  // collective (every rank reaches it on the first try, before a `release_error` fault can
  // stop a rank), and a failed one has already aborted the communicator and is reported
  // once; the retry then only releases the host runtime.
  auto ncclDone = std::make_shared<bool>(false);
  std::weak_ptr<resources::RankResources> owner = resources_;
  manager.setRuntimeRelease([hostRelease = std::move(hostRelease), nccl, ncclDone, owner] {
    if (!*ncclDone) {
      *ncclDone = true;
      const resources::NcclReleaseReport report = nccl->release();
      if (auto rank = owner.lock(); rank && rank->ncclRuntime() == nccl) {
        rank->setNcclRuntime(nullptr);
      }
      report.throwIfFailed();
    }
    hostRelease();
  });
#else
  (void)resources;
  manager.setRuntimeRelease(resources_->createRuntime());
#endif
}

ScratchLinear::ScratchLinear(ScratchOptions options)
    : ScratchModule("scratch_linear", std::move(options)) {}

ScratchMLP::ScratchMLP(ScratchOptions options) : ScratchModule("scratch_mlp", std::move(options)) {}

std::string detail::specificationText(std::string_view kind, std::int64_t features,
                                      std::int64_t workspaceBytes) {
  // A kind that JSON writes as it is (printable ASCII but '"' and '\\'): the text directly.
  // Another (a subclass's own kind) goes through the document, which escapes it.
  const bool plain = std::all_of(kind.begin(), kind.end(), [](char c) {
    return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  });
  if (!plain) {
    return nlohmann::json{
        {"type", std::string(kind)}, {"features", features}, {"workspace_bytes", workspaceBytes}}
        .dump();
  }
  return fmt::format(R"({{"features":{},"type":"{}","workspace_bytes":{}}})", features, kind,
                     workspaceBytes);
}

std::shared_ptr<ScratchModule> makeScratchModule(const std::string& type, ScratchOptions options) {
  if (type == "scratch_linear") return std::make_shared<ScratchLinear>(std::move(options));
  if (type == "scratch_mlp") return std::make_shared<ScratchMLP>(std::move(options));
  return nullptr;
}

}  // namespace hmc::nn
