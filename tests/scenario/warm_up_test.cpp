// RankWarmUp: what a rank process runs on a thread of its own while its world forms, and
// that the steps after it draw the numbers they would have drawn without it.

#include <string>

#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/scenario/thread_driver.hpp"
#include "support/scoped_variable.hpp"
#include "support/torch_doctest.hpp"

namespace {

using hmc::scenario::Device;
using hmc::scenario::Op;
using hmc::scenario::parseScenarioText;
using hmc::scenario::warmUpScenario;
using hmc::testing::ScopedVariable;

hmc::scenario::Scenario parse(const std::string& steps, const std::string& top = "") {
  return parseScenarioText(
      R"({"format": "hmc-scenario/1", "name": "w", "world_size": 2, "dtype": "float64", )" +
          top + R"("steps": )" + steps + "}",
      "w.json");
}

}  // namespace

TEST_CASE("warmUpScenario: the first module's create and forward, inside repeat too") {
  const auto scenario = parse(R"([
    {"op": "barrier"},
    {"op": "repeat", "count": 5, "steps": [
      {"op": "create", "module": "a", "type": "scratch_mlp", "features": 24,
       "workspace_bytes": 100, "compat": {"k": 1}, "scope": "s", "ranks": [1],
       "expect": "error"},
      {"op": "create", "module": "b", "features": 8},
      {"op": "forward", "module": "b", "batch": 2},
      {"op": "forward", "module": "a", "batch": 3, "dtype": "float32", "ranks": [0]},
      {"op": "drop", "module": "a"},
      {"op": "drop", "module": "b"}
    ]}])");
  const auto warm = warmUpScenario(scenario);
  REQUIRE(warm.has_value());
  CHECK(warm->worldSize == 1);
  CHECK((warm->device == Device::kCpu));
  CHECK(warm->dtype == "float64");
  CHECK(warm->timeoutS == 30);
  REQUIRE(warm->steps.size() == 4);
  const auto& create = warm->steps[0];
  CHECK((create.op == Op::kCreate));
  CHECK(create.module == "a");
  CHECK(create.type == "scratch_mlp");
  CHECK(create.features == 24);
  CHECK(create.workspaceBytes == 100);
  CHECK(create.compat == nlohmann::json{{"k", 1}});
  CHECK(create.scope == "s");
  CHECK_FALSE(create.ranks.has_value());
  CHECK((create.expect == hmc::scenario::Expect::kOk));
  const auto& forward = warm->steps[1];
  CHECK((forward.op == Op::kForward));
  CHECK(forward.module == "a");
  CHECK(forward.batch == 3);
  CHECK(forward.dtype == "float32");
  CHECK((forward.device == Device::kCpu));
  CHECK(forward.backward);
  CHECK_FALSE(forward.ranks.has_value());
  CHECK((warm->steps[2].op == Op::kDrop));
  CHECK(warm->steps[2].module == "a");
  CHECK((warm->steps[3].op == Op::kCloseAll));
  CHECK(warm->steps[3].path == "/steps/3");
}

TEST_CASE("warmUpScenario: a module never forwarded gets the default batch") {
  const auto warm = warmUpScenario(parse(R"([{"op": "create", "module": "m"}])"));
  REQUIRE(warm.has_value());
  CHECK(warm->steps[1].batch == 8);
  CHECK_FALSE(warm->steps[1].dtype.has_value());
}

TEST_CASE("warmUpScenario: small sizes, whatever the scenario's") {
  const auto warm = warmUpScenario(parse(R"([
    {"op": "create", "module": "m", "features": 16384, "workspace_bytes": 1073741824},
    {"op": "forward", "module": "m", "batch": 4096}])"));
  REQUIRE(warm.has_value());
  CHECK(warm->steps[0].features == hmc::scenario::kWarmUpMaxFeatures);
  CHECK(warm->steps[0].workspaceBytes == hmc::scenario::kWarmUpMaxWorkspaceBytes);
  CHECK(warm->steps[1].batch == hmc::scenario::kWarmUpMaxBatch);
  // Without workspace_bytes the module's default follows the capped features.
  const auto plain = warmUpScenario(parse(R"([{"op": "create", "module": "m", "features": 512}])"));
  REQUIRE(plain.has_value());
  CHECK(plain->steps[0].features == hmc::scenario::kWarmUpMaxFeatures);
  CHECK_FALSE(plain->steps[0].workspaceBytes.has_value());
}

TEST_CASE("warmUpScenario: none without a module, none on CUDA") {
  CHECK_FALSE(warmUpScenario(parse(R"([{"op": "barrier"}])")).has_value());
  CHECK_FALSE(warmUpScenario(parse(R"([{"op": "create", "module": "m"},
      {"op": "forward", "module": "m", "device": "cuda"}])"))
                  .has_value());
  CHECK_FALSE(
      warmUpScenario(parse(R"([{"op": "create", "module": "m"}])", R"("device": "cuda", )"))
          .has_value());
  // The first forward of the module decides, not the scenario's device.
  CHECK(warmUpScenario(parse(R"([{"op": "create", "module": "m"},
      {"op": "forward", "module": "m", "device": "cpu"}])",
                             R"("device": "cuda", )"))
            .has_value());
}

TEST_CASE("RankWarmUp: says why it does not run") {
  {
    ScopedVariable off(hmc::scenario::kRankWarmUpVariable, "0");
    hmc::scenario::RankWarmUp warmUp(parse(R"([{"op": "create", "module": "m"}])"));
    warmUp.finish();
    CHECK(warmUp.skipped() == "HMC_RANK_WARM_UP=0");
    CHECK_FALSE(warmUp.took().has_value());
  }
  hmc::scenario::RankWarmUp none(parse(R"([{"op": "barrier"}])"));
  none.finish();
  CHECK(none.skipped() == "the scenario creates no module on the CPU");
  CHECK_FALSE(none.took().has_value());
}

TEST_CASE("RankWarmUp: runs, and the steps after it draw what they would have drawn") {
  const auto scenario = parse(R"([{"op": "create", "module": "m", "features": 16},
      {"op": "forward", "module": "m"}])",
                              R"("device": "cpu", )");
  const auto restore = hmc::scenario::saveCpuGeneratorState();
  const torch::Tensor without = torch::randn({32});
  restore();
  {
    ScopedVariable on(hmc::scenario::kRankWarmUpVariable, "1");
    hmc::scenario::RankWarmUp warmUp(scenario);
    warmUp.finish();
    warmUp.finish();  // once
    CHECK(warmUp.skipped().empty());
    REQUIRE(warmUp.took().has_value());
    CHECK(warmUp.took()->count() > 0);
  }
  // The warm-up's create and forward drew from it (torch::randn): without the state put back,
  // these would be later numbers.
  const torch::Tensor with = torch::randn({32});
  CHECK(torch::equal(with, without));
}
