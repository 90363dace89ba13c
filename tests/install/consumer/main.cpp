// A program outside the hmc tree that finds the installed package and uses hmc::torch.
#include <torch/torch.h>
#include "hmc/torch/scratch_modules.hpp"
int main() {
  auto m = std::make_shared<hmc::nn::ScratchLinear>();
  m->forward(torch::randn({2, 64})).sum().backward();
  m->manager().shutdown();
  return m->resourceGroup()->closed ? 0 : 1;
}
