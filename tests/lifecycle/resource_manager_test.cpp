// The lifecycle manager against the reference's semantics, with ranks as threads. Modules
// are emulated here (MulticoreModule's binding steps without torch); tests/torch covers the
// module base itself.

#include "hmc/lifecycle/resource_manager.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <limits>
#include <string>
#include <vector>

#include "hmc/error.hpp"
#include "hmc/resources/host_resources.hpp"
#include "support/thread_ranks.hpp"

using namespace std::chrono_literals;
using hmc::lifecycle::Binding;
using hmc::lifecycle::GroupPtr;
using hmc::lifecycle::ResourceManager;
using hmc::resources::HostWorkspace;
using hmc::resources::RankResources;
using hmc::testing::runThreadRanks;
using nlohmann::json;

namespace {

const Binding kCpuF32{"cpu", "float32"};
const Binding kCpuF64{"cpu", "float64"};

// One rank's manager and resources, and a module's binding steps.
struct Rank {
  explicit Rank(std::shared_ptr<hmc::collective::Collective> collective)
      : manager(std::make_shared<ResourceManager>(std::move(collective))),
        resources(std::make_shared<RankResources>()) {}

  struct Module {
    GroupPtr group;
    hmc::lifecycle::MemberToken token;
  };

  Module create(const std::string& compat, const std::string& scope = "default") {
    auto [group, token] = manager->createGroup(json{{"spec", compat}}, compat, scope);
    return {group, token};
  }
  void drop(const Module& m) { manager->retire(m.group->identifier, m.token); }

  // getExecutionResources: recycle first, then create. Returns whether it reused.
  bool bind(const Module& m, const std::string& type = "ScratchLinear",
            const Binding& binding = kCpuF32, std::int64_t bytes = 64) {
    GroupPtr group = m.group;
    group->moduleType = type;
    manager->registerAutomaticCleanup();
    manager->recycle(*group, binding, json::array({type, "torch." + binding.dtype}));
    if (group->resources) return true;
    group->resources =
        std::make_shared<HostWorkspace>("scratch_linear", bytes, binding.dtype, resources);
    group->binding = binding;
    group->bindingId = manager->nextBindingId();
    if (!manager->runtimeRelease()) manager->setRuntimeRelease(resources->createRuntime());
    return false;
  }
  HostWorkspace& workspace(const Module& m) {
    return static_cast<HostWorkspace&>(*m.group->resources);
  }

  std::shared_ptr<ResourceManager> manager;
  std::shared_ptr<RankResources> resources;
};

constexpr int kWorlds[] = {2, 3, 4, 8};

}  // namespace

TEST_SUITE("lifecycle") {
  TEST_CASE("the first noted failure is kept, and onFirstFailure runs once, after it is kept") {
    // A world writes its heartbeat there (world.cpp): a rank that dies a moment later has said
    // what it met. The callback sees the failure already kept.
    auto world = hmc::collective::ThreadWorld::create(1);
    ResourceManager manager(world->collective(0, 1000ms));
    int calls = 0;
    std::string seen;
    manager.onFirstFailure([&] {
      ++calls;
      seen = manager.firstFailure() ? manager.firstFailure()->message : "none";
    });
    manager.noteFailure("forward", hmc::RuntimeError("first"), 0);
    manager.noteFailure("close", hmc::RuntimeError("second"), 0);
    CHECK(calls == 1);
    CHECK(seen.find("first") != std::string::npos);
    CHECK(manager.firstFailure()->message.find("first") != std::string::npos);
    CHECK(manager.failureCount() == 2);
  }

  TEST_CASE("a dropped module's idle workspace is reused by the next compatible module") {
    for (int world : kWorlds) {
      CAPTURE(world);
      std::vector<int> reusedIds(world, -1);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        CHECK_FALSE(r.bind(a));
        HostWorkspace* first = &r.workspace(a);
        r.drop(a);
        CHECK(r.manager->groupCount() == 1);  // still holds resources
        auto b = r.create("k");
        CHECK(r.bind(b));
        CHECK(&r.workspace(b) == first);
        CHECK(a.group->closed);
        CHECK(r.manager->groupCount() == 1);
        reusedIds[rank] = static_cast<int>(*b.group->bindingId);
        r.manager->closeGroups();
        CHECK(r.resources->liveRuntime() == nullptr);
        CHECK(r.resources->accounting().bytesHeld() == 0);
      });
      for (int rank = 0; rank < world; ++rank) {
        CHECK(outcomes[rank].ok());
        CHECK(reusedIds[rank] == 0);
      }
    }
  }

  TEST_CASE("an incompatible idle orphan is closed collectively on the next binding") {
    for (int world : kWorlds) {
      CAPTURE(world);
      auto outcomes = runThreadRanks(world, [&](int, auto collective) {
        Rank r(collective);
        auto a = r.create("k1");
        r.bind(a);
        r.drop(a);
        auto b = r.create("k2");
        CHECK_FALSE(r.bind(b));
        CHECK(a.group->closed);
        CHECK(a.group->resources == nullptr);
        CHECK(r.manager->groupCount() == 1);
        CHECK(r.resources->accounting().workspacesClosed == 1);
        CHECK(*b.group->bindingId == 1);
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
    }
  }

  TEST_CASE("an orphan busy on any rank is skipped, neither reused nor closed") {
    for (int world : kWorlds) {
      CAPTURE(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        r.bind(a);
        r.workspace(a).setBusy(rank == world - 1);
        r.drop(a);
        auto b = r.create("k");
        CHECK_FALSE(r.bind(b));
        CHECK_FALSE(a.group->closed);
        CHECK(a.group->resources != nullptr);
        CHECK(r.manager->boundGroupCount() == 2);
        r.workspace(a).setBusy(false);
        r.manager->closeGroups();
        CHECK(r.manager->groupCount() == 0);
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
    }
  }

  TEST_CASE(
      "the first group compatible on every rank in binding order is reused, other idle "
      "groups are closed") {
    for (int world : kWorlds) {
      CAPTURE(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto g0 = r.create("other");
        auto g1 = r.create("k");
        auto g2 = r.create("k");
        r.bind(g0);
        r.bind(g1);
        r.bind(g2);
        r.drop(g2);
        r.drop(g1);
        r.drop(g0);
        auto b = r.create("k");
        CHECK(r.bind(b));
        CHECK(*b.group->bindingId == 1);  // g1 bound before g2
        CHECK(g0.group->closed);
        CHECK(g2.group->closed);
        CHECK(r.manager->groupCount() == 1);
        CHECK(r.resources->accounting().workspacesClosed == 2);
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
    }
  }

  TEST_CASE("a group compatible on some ranks only is closed, not reused") {
    auto outcomes = runThreadRanks(2, [&](int rank, auto collective) {
      Rank r(collective);
      auto a = r.create(rank == 0 ? "k" : "k-other");
      r.bind(a);
      r.drop(a);
      auto b = r.create("k");
      CHECK_FALSE(r.bind(b));
      CHECK(a.group->closed);
    });
    for (const auto& outcome : outcomes) CHECK(outcome.ok());
  }

  TEST_CASE("another module type blocks reuse") {
    for (int world : kWorlds) {
      auto outcomes = runThreadRanks(world, [&](int, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        r.bind(a, "ScratchLinear");
        r.drop(a);
        auto b = r.create("k");
        // The signature includes the type, and manifests agree, so the orphan is closed.
        CHECK_FALSE(r.bind(b, "ScratchMLP"));
        CHECK(a.group->closed);
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
    }
  }

  TEST_CASE("another binding (dtype) or scope blocks reuse") {
    auto outcomes = runThreadRanks(2, [&](int, auto collective) {
      Rank r(collective);
      auto a = r.create("k");
      r.bind(a, "ScratchLinear", kCpuF32);
      r.drop(a);
      auto b = r.create("k");
      CHECK_FALSE(r.bind(b, "ScratchLinear", kCpuF64));
      auto c = r.create("k", "other-scope");
      r.drop(b);
      CHECK_FALSE(r.bind(c, "ScratchLinear", kCpuF64));
    });
    for (const auto& outcome : outcomes) CHECK(outcome.ok());
  }

  TEST_CASE("a group with members is neither reused nor closed") {
    auto outcomes = runThreadRanks(2, [&](int, auto collective) {
      Rank r(collective);
      auto a = r.create("k");
      r.bind(a);
      auto b = r.create("k");
      CHECK_FALSE(r.bind(b));
      CHECK_FALSE(a.group->closed);
      CHECK(r.manager->boundGroupCount() == 2);
    });
    for (const auto& outcome : outcomes) CHECK(outcome.ok());
  }

  TEST_CASE("close_groups closes in binding order and releases the runtime once") {
    for (int world : kWorlds) {
      auto outcomes = runThreadRanks(world, [&](int, auto collective) {
        Rank r(collective);
        auto a = r.create("k1");
        auto b = r.create("k2");
        auto unbound = r.create("k3");
        r.bind(b);
        r.bind(a);
        CHECK(r.resources->liveRuntime() != nullptr);
        r.manager->closeGroups();
        CHECK(a.group->closed);
        CHECK(b.group->closed);
        CHECK(unbound.group->closed);
        CHECK(unbound.group->members.empty());
        CHECK(r.manager->groupCount() == 0);
        CHECK(r.resources->liveRuntime() == nullptr);
        CHECK(r.resources->accounting().runtimesReleased == 1);
        CHECK_FALSE(r.manager->runtimeRelease());
        r.manager->closeGroups();  // nothing left: no collective beyond validation
        CHECK(r.resources->accounting().runtimesReleased == 1);
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
    }
  }

  TEST_CASE("a runtime-release failure on one rank raises everywhere and a retry releases once") {
    for (int world : kWorlds) {
      CAPTURE(world);
      std::vector<std::string> first(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        r.bind(a);
        if (rank == 1) r.resources->faults().releaseErrors = 1;
        try {
          r.manager->closeGroups();
        } catch (const hmc::RuntimeError& error) {
          first[rank] = error.what();
        }
        CHECK(a.group->closed);
        CHECK(r.manager->runtimeRelease());  // kept for the retry
        // The ranks that released do not release twice.
        CHECK(r.resources->accounting().runtimesReleased == (rank == 1 ? 0 : 1));
        r.manager->closeGroups(std::vector<GroupPtr>{});
        CHECK(r.resources->accounting().runtimesReleased == 1);
        CHECK_FALSE(r.manager->runtimeRelease());
      });
      for (int rank = 0; rank < world; ++rank) {
        CHECK(outcomes[rank].ok());
        CHECK(first[rank] ==
              "multicore Runtime release failed on ranks [1]: RuntimeError: injected runtime "
              "release failure");
      }
    }
  }

  TEST_CASE("a workspace close failure keeps ownership and a retry closes") {
    for (int world : kWorlds) {
      CAPTURE(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        r.bind(a);
        if (rank == 0) r.resources->faults().closeErrors = 1;
        std::string message;
        try {
          r.manager->closeGroups();
        } catch (const hmc::RuntimeError& error) {
          message = error.what();
        }
        CHECK(message ==
              "multicore resource close failed on ranks [0]: RuntimeError: injected workspace "
              "close failure");
        CHECK(a.group->closing);
        CHECK_FALSE(a.group->closed);
        CHECK(a.group->resources != nullptr);
        CHECK(r.manager->groupCount() == 1);
        CHECK(r.resources->liveRuntime() != nullptr);
        r.manager->closeGroups();
        CHECK(a.group->closed);
        CHECK(r.manager->groupCount() == 0);
        CHECK(r.resources->liveRuntime() == nullptr);
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
    }
  }

  TEST_CASE("a closing group is not idle: recycle neither reuses nor closes it") {
    auto outcomes = runThreadRanks(2, [&](int rank, auto collective) {
      Rank r(collective);
      auto a = r.create("k");
      r.bind(a);
      r.resources->faults().closeErrors = 1;
      CHECK_THROWS_AS(r.manager->closeGroups(), hmc::RuntimeError);
      r.drop(a);
      auto b = r.create("k");
      CHECK_FALSE(r.bind(b));
      CHECK(a.group->resources != nullptr);
    });
    for (const auto& outcome : outcomes) CHECK(outcome.ok());
  }

  TEST_CASE("pending work on any rank blocks close on every rank") {
    for (int world : kWorlds) {
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        r.bind(a);
        if (rank == 0) r.workspace(a).addPending();
        std::string message;
        try {
          r.manager->closeGroups();
        } catch (const hmc::RuntimeError& error) {
          message = error.what();
        }
        CHECK(message ==
              "multicore cleanup requires idle workspaces and no pending backward graphs");
        CHECK_FALSE(a.group->closing);
        CHECK(a.group->resources != nullptr);
        if (rank == 0) r.workspace(a).removePending();
        r.manager->closeGroups();
        CHECK(a.group->closed);
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
    }
  }

  TEST_CASE("divergent manifests raise on every rank before any close") {
    for (int world : kWorlds) {
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        // The last rank's workspace differs in size: its manifest differs.
        r.bind(a, "ScratchLinear", kCpuF32, rank == world - 1 ? 128 : 64);
        std::string message;
        try {
          r.manager->closeGroups();
        } catch (const hmc::RuntimeError& error) {
          message = error.what();
        }
        CHECK(message == "multicore resource manifests differ across ranks");
        CHECK(r.resources->accounting().workspacesClosed == 0);
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
    }
  }

  TEST_CASE("divergent signatures and binding order raise on every rank") {
    for (int world : kWorlds) {
      CAPTURE(world);
      // dtype differs on one rank: the signature differs.
      auto signature = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        r.bind(a, "ScratchLinear", rank == 0 ? kCpuF64 : kCpuF32);
      });
      for (const auto& outcome : signature) {
        CHECK(outcome.kind() == "runtime_error");
        CHECK(outcome.message() ==
              "multicore resource binding order or specifications differ across ranks");
      }
      // Two modules bound in a different order on one rank: manifests differ at the next bind.
      auto order = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        auto b = r.create("k2");
        const bool swap = rank == 1;
        r.bind(swap ? b : a, "ScratchLinear", kCpuF32, swap ? 128 : 64);
        r.bind(swap ? a : b, "ScratchLinear", kCpuF32, swap ? 64 : 128);
        auto c = r.create("k3");
        r.bind(c);
      });
      for (const auto& outcome : order) {
        CHECK(outcome.message() ==
              "multicore resource binding order or specifications differ across ranks");
      }
    }
  }

  TEST_CASE("a manifest mismatch is diagnosed with every rank's manifest and ranks stay in step") {
    for (int world : kWorlds) {
      CAPTURE(world);
      std::vector<json> diagnoses(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        r.bind(a, "ScratchLinear", kCpuF32, rank == 1 ? 128 : 64);
        CHECK_THROWS_WITH_AS(r.manager->closeGroups(),
                             "multicore resource manifests differ across ranks", hmc::RuntimeError);
        REQUIRE(r.manager->lastMismatch());
        diagnoses[rank] = *r.manager->lastMismatch();
        // The diagnosis exchange kept every rank at the same sequence number: a later
        // collective still meets.
        r.manager->clearLastMismatch();
        CHECK_FALSE(r.manager->lastMismatch());
        collective->barrier();
      });
      for (const auto& outcome : outcomes) CHECK(outcome.ok());
      for (const json& diagnosis : diagnoses) {
        CHECK(diagnosis == diagnoses[0]);
        CHECK(diagnosis["stage"] == "close validation");
        CHECK(diagnosis["ranks"].size() == static_cast<std::size_t>(world));
        CHECK(diagnosis["first_difference"]["rank"] == 1);
        CHECK(diagnosis["first_difference"]["index"] == 0);
        CHECK(diagnosis["first_difference"]["rank0"][1][1] == 64);
        CHECK(diagnosis["first_difference"]["this_rank"][1][1] == 128);
      }
    }
  }

  TEST_CASE("the recycle digest tells apart what the full manifests tell apart") {
    using hmc::lifecycle::detail::digestOf;
    const json signature = {{"kind", "ScratchLinear"}, {"dtype", "float32"}, {"sizes", {64, 8}},
                            {"bias", true}, {"scale", 0.5}, {"note", nullptr}};
    // Equal values (built apart) give equal digests; a copy is no different.
    CHECK(digestOf(signature) == digestOf(json::parse(signature.dump())));
    // Every change, however deep, changes the digest.
    const std::vector<json> changed = {
        json::parse(R"({"kind":"ScratchLinear","dtype":"float64","sizes":[64,8],"bias":true,"scale":0.5,"note":null})"),
        json::parse(R"({"kind":"ScratchLinear","dtype":"float32","sizes":[8,64],"bias":true,"scale":0.5,"note":null})"),
        json::parse(R"({"kind":"ScratchLinear","dtype":"float32","sizes":[64,8],"bias":false,"scale":0.5,"note":null})"),
        json::parse(R"({"kind":"ScratchLinear","dtype":"float32","sizes":[64,8],"bias":true,"scale":0.25,"note":null})"),
        json::parse(R"({"kind":"ScratchLinear","dtype":"float32","sizes":[64,8],"bias":true,"scale":0.5})"),
        json::parse(R"({"kind":"ScratchLinear","dtype":"float32","sizes":[64,8],"bias":true,"scale":0.5,"notes":null})"),
    };
    for (const json& other : changed) {
      CAPTURE(other.dump());
      CHECK(digestOf(other) != digestOf(signature));
    }
    // Two values share a digest exactly when their CBOR (the full-manifest agreement's
    // comparison) is the same: values that print alike or run together in a byte stream stay
    // apart, and a signed and an unsigned 1, or two NaNs, are one value there as here.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const std::vector<json> values = {
        json(1), json(1u), json(-1), json(1.0), json(true), json("1"), json::array({1}),
        json(nullptr), json(-0.0), json(0.0), json(nan), json(-nan), json::array(),
        json::object(), json::array({"ab", "c"}), json::array({"a", "bc"}),
        json::array({json::array({1}), 2}), json::array({1, json::array({2})}),
        json::object({{"a", "b"}}), json::array({"a", "b"}), json::binary({1, 2}),
        json::binary({1, 2}, 7), json::array({1, 2})};
    // Two strings whose bytes, run together with the string tag between them, are the same
    // stream: only the strings' sizes tell them apart.
    std::string tag(8, '\0');
    tag[0] = static_cast<char>(json::value_t::string);
    const std::vector<json> runTogether = {json::array({"x", "y" + tag + "z"}),
                                           json::array({"x" + tag + "y", "z"})};
    CHECK(digestOf(runTogether[0]) != digestOf(runTogether[1]));
    int same = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      for (std::size_t j = i + 1; j < values.size(); ++j) {
        CAPTURE(values[i].dump(-1, ' ', false, json::error_handler_t::replace));
        CAPTURE(values[j].dump(-1, ' ', false, json::error_handler_t::replace));
        const bool cborSame = json::to_cbor(values[i]) == json::to_cbor(values[j]);
        CHECK((digestOf(values[i]) == digestOf(values[j])) == cborSame);
        same += cborSame ? 1 : 0;
      }
    }
    CHECK(same == 2);  // 1 and 1u; NaN and -NaN
  }

  TEST_CASE("the recycle payload stays small however many groups are bound") {
    struct Sizes : hmc::collective::CollectiveObserver {
      std::vector<std::size_t> bytes;
      void onEnter(const hmc::collective::CollectiveRecord& r) override {
        bytes.push_back(r.payloadBytes);
      }
      void onExit(const hmc::collective::CollectiveRecord&) override {}
    } sizes;
    auto collective = std::make_shared<hmc::collective::LocalCollective>();
    collective->setObserver(&sizes);
    Rank r(collective);
    std::vector<Rank::Module> live;
    for (int i = 0; i < 64; ++i) {
      live.push_back(r.create("k" + std::to_string(i)));
      r.bind(live.back());
    }
    // 12 bytes of digest and count, then 2 bits per bound group.
    CHECK(sizes.bytes.back() == 12 + 2 * ((63 + 7) / 8));
    collective->setObserver(nullptr);
  }

  TEST_CASE("the full-manifest agreement reuses, closes and diagnoses as the digest does") {
    for (int world : kWorlds) {
      CAPTURE(world);
      auto reuse = runThreadRanks(world, [&](int, auto collective) {
        Rank r(collective);
        r.manager->setAgreement(hmc::lifecycle::Agreement::kFullManifest);
        auto a = r.create("k");
        CHECK_FALSE(r.bind(a));
        auto other = r.create("other");
        CHECK_FALSE(r.bind(other, "ScratchLinear", kCpuF32, 128));
        r.drop(a);
        r.drop(other);
        auto b = r.create("k");
        CHECK(r.bind(b));  // reuses a's workspace; the incompatible idle one is closed
        CHECK(r.manager->boundGroupCount() == 1);
        CHECK(r.resources->accounting().workspacesClosed == 1);
        r.manager->closeGroups();
      });
      for (const auto& outcome : reuse) CHECK(outcome.ok());
      std::vector<json> diagnoses(world);
      auto mismatch = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        r.manager->setAgreement(hmc::lifecycle::Agreement::kFullManifest);
        auto a = r.create("k");
        r.bind(a, "ScratchLinear", kCpuF32, rank == 1 ? 128 : 64);
        auto b = r.create("k2");
        CHECK_THROWS_WITH_AS(
            r.bind(b), "multicore resource binding order or specifications differ across ranks",
            hmc::RuntimeError);
        REQUIRE(r.manager->lastMismatch());
        diagnoses[rank] = *r.manager->lastMismatch();
        collective->barrier();  // no diagnosis exchange: ranks stay in step
      });
      for (const auto& outcome : mismatch) CHECK(outcome.ok());
      for (const json& diagnosis : diagnoses) {
        CHECK(diagnosis == diagnoses[0]);
        CHECK(diagnosis["stage"] == "recycle");
        CHECK(diagnosis["first_difference"]["rank"] == 1);
        CHECK(diagnosis["first_difference"]["this_rank"][1][1] == 128);
      }
    }
  }

  TEST_CASE("ranks in different stages raise collective_mismatch everywhere, no side effect") {
    for (int world : kWorlds) {
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        Rank r(collective);
        auto a = r.create("k");
        r.bind(a);
        r.drop(a);
        if (rank == 0) {
          auto b = r.create("k");
          r.bind(b);  // 'recycle' would reuse a
        } else {
          r.manager->closeGroups();  // 'close validation' would close a
        }
      });
      for (const auto& outcome : outcomes) {
        CHECK(outcome.kind() == "collective_mismatch");
        CHECK(outcome.message().find("'recycle'") != std::string::npos);
        CHECK(outcome.message().find("'close validation'") != std::string::npos);
      }
    }
  }

  TEST_CASE("a mismatch leaves every group as it was") {
    std::vector<std::size_t> bound(2);
    runThreadRanks(2, [&](int rank, auto collective) {
      Rank r(collective);
      auto a = r.create("k");
      r.bind(a);
      r.drop(a);
      try {
        if (rank == 0) {
          r.bind(r.create("k"));
        } else {
          r.manager->closeGroups();
        }
      } catch (const hmc::CollectiveMismatch&) {
      }
      bound[rank] = r.manager->boundGroupCount();
      CHECK_FALSE(a.group->closed);
      CHECK_FALSE(a.group->closing);
    });
    CHECK(bound == std::vector<std::size_t>{1, 1});
  }

  TEST_CASE("a rank that never arrives gives a timeout that names the stage") {
    auto outcomes = runThreadRanks(
        2,
        [&](int rank, auto collective) {
          Rank r(collective);
          auto a = r.create("k");
          if (rank == 0) r.bind(a);
        },
        200ms);
    CHECK(outcomes[0].kind() == "timeout");
    CHECK(outcomes[0].message().find("'recycle' #0") != std::string::npos);
    CHECK(outcomes[0].message().find("ranks [1] did not arrive") != std::string::npos);
    CHECK(outcomes[1].ok());
  }

  TEST_CASE("retire forgets only unbound groups without members") {
    Rank r(std::make_shared<hmc::collective::LocalCollective>());
    auto a = r.create("k");
    auto token = r.manager->addMember(*a.group);
    r.drop(a);
    CHECK(r.manager->groupCount() == 1);
    r.manager->retire(a.group->identifier, token);
    CHECK(r.manager->groupCount() == 0);
    CHECK(a.group->closed);
    r.manager->retire(a.group->identifier, token);  // unknown group: nothing happens
    r.manager->retire(12345, 0);
  }

  TEST_CASE("active specifications list groups with members or resources in the scope") {
    Rank r(std::make_shared<hmc::collective::LocalCollective>());
    auto a = r.create("a");
    auto b = r.create("b", "other");
    auto c = r.create("c");
    r.bind(c);
    r.drop(c);
    auto specs = r.manager->activeSpecifications("default");
    REQUIRE(specs.size() == 2);
    CHECK(specs[0] == json{{"spec", "a"}});
    CHECK(specs[1] == json{{"spec", "c"}});
    CHECK(r.manager->activeSpecifications("other").size() == 1);
  }

  TEST_CASE("shutdown closes every group once registered, and only then") {
    Rank r(std::make_shared<hmc::collective::LocalCollective>());
    r.manager->shutdown();  // nothing registered
    auto a = r.create("k");
    r.bind(a);
    CHECK(r.manager->automaticCleanupRegistered());
    r.manager->shutdown();
    CHECK(a.group->closed);
    CHECK(r.resources->liveRuntime() == nullptr);
    CHECK_FALSE(r.manager->automaticCleanupRegistered());
  }

  TEST_CASE("current() is the thread's scoped manager, else the process default") {
    auto mine =
        std::make_shared<ResourceManager>(std::make_shared<hmc::collective::LocalCollective>());
    CHECK(ResourceManager::current() == ResourceManager::processDefault());
    {
      ResourceManager::Scope scope(mine);
      CHECK(ResourceManager::current() == mine);
    }
    CHECK(ResourceManager::current() == ResourceManager::processDefault());
  }

  TEST_CASE("binding repr reads like the reference's tuple") {
    CHECK(kCpuF32.repr() == "(device(type='cpu'), torch.float32)");
    CHECK(Binding{"cuda:1", "float16"}.repr() == "(device(type='cuda', index=1), torch.float16)");
  }
}
