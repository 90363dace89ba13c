// The parts of hmc_cuda that need the CUDA and NCCL libraries but no device: error messages
// of the checks, the NCCL version guard, the device probe's answer, the device registry.
// Runs on every machine of a CUDA build.

#include <doctest/doctest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <string>

#include "hmc/collective/nccl_transport.hpp"
#include "hmc/error.hpp"
#include "hmc/resources/cuda_check.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/resources/device_registry.hpp"
#include "hmc/resources/nccl_runtime.hpp"

using hmc::resources::decodeNcclVersion;
using hmc::resources::DeviceHandleKind;
using hmc::resources::DeviceRegistry;

namespace {

bool startsWith(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

// Registers an `hmc` logger writing into a string for the test's lifetime.
struct CapturedLog {
  CapturedLog() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream);
    logger = std::make_shared<spdlog::logger>("hmc", sink);
    spdlog::register_logger(logger);
  }
  ~CapturedLog() { spdlog::drop("hmc"); }
  std::ostringstream stream;
  std::shared_ptr<spdlog::logger> logger;
};

}  // namespace

TEST_SUITE("cuda_host") {
  TEST_CASE("NCCL version codes decode before and after 2.9") {
    CHECK(decodeNcclVersion(22809).str() == "2.28.9");
    CHECK(decodeNcclVersion(21903).str() == "2.19.3");
    CHECK(decodeNcclVersion(2804).str() == "2.8.4");
    CHECK(decodeNcclVersion(30001).str() == "3.0.1");
    CHECK(decodeNcclVersion(hmc::resources::compiledNcclVersionCode()).major == NCCL_MAJOR);
  }

  TEST_CASE("a different NCCL major is refused with a message that says what to do") {
    CHECK_NOTHROW(hmc::resources::requireCompatibleNccl(22809, 22105, "/x/libnccl.so.2"));
    try {
      hmc::resources::requireCompatibleNccl(22809, 30001, "/x/libnccl.so.2");
      FAIL("a major mismatch was accepted");
    } catch (const hmc::BackendError& error) {
      const std::string message = error.what();
      CHECK(startsWith(message,
                       "NCCL version mismatch: hmc was compiled against NCCL 2.28.9 (nccl.h) "
                       "but this process loaded NCCL 3.0.1 from /x/libnccl.so.2"));
      CHECK(message.find("never load two different libnccl.so.2") != std::string::npos);
    }
  }

  TEST_CASE("the NCCL this process loaded is the one hmc was compiled with, loaded once") {
    const auto loaded = hmc::resources::checkNcclVersion();
    CHECK(loaded.major == NCCL_MAJOR);
    const auto libraries = hmc::resources::loadedNcclLibraries();
    REQUIRE(libraries.size() == 1);
    CHECK(libraries.front().find("libnccl") != std::string::npos);
  }

  TEST_CASE("failed checks raise BackendError with the rank, the call and the library's text") {
    {
      hmc::resources::ScopedCheckRank rank(3);
      CHECK(hmc::resources::checkRank() == 3);
      CHECK_THROWS_WITH_AS(HMC_CUDA_CHECK(cudaError_t{cudaErrorMemoryAllocation}),
                           doctest::Contains("rank 3: cudaError_t{cudaErrorMemoryAllocation} "
                                             "failed: out of memory (cudaErrorMemoryAllocation) "
                                             "[cuda_host_test.cpp:"),
                           hmc::BackendError);
      CHECK_THROWS_WITH_AS(HMC_NCCL_CHECK(ncclResult_t{ncclInvalidArgument}),
                           doctest::Contains("rank 3: ncclResult_t{ncclInvalidArgument} failed: "
                                             "invalid argument"),
                           hmc::BackendError);
      CHECK_NOTHROW(HMC_NCCL_CHECK_ASYNC(ncclResult_t{ncclInProgress}));
      CHECK_THROWS_AS(HMC_NCCL_CHECK(ncclResult_t{ncclInProgress}), hmc::BackendError);
    }
    CHECK(hmc::resources::checkRank() == -1);
    // Without a rank the prefix is left out.
    CHECK(startsWith(
        hmc::resources::detail::cudaFailureMessage(cudaErrorInvalidValue, "f()", "/a/b.cpp", 7, -1),
        "f() failed: invalid argument (cudaErrorInvalidValue) [b.cpp:7]"));
  }

  TEST_CASE("the non-throwing checks log to the hmc logger and answer false") {
    CapturedLog log;
    CHECK(HMC_CUDA_CHECK_NOTHROW(cudaError_t{cudaSuccess}));
    CHECK_FALSE(HMC_CUDA_CHECK_NOTHROW(cudaError_t{cudaErrorInvalidValue}));
    CHECK_FALSE(HMC_NCCL_CHECK_NOTHROW(ncclResult_t{ncclSystemError}));
    CHECK(HMC_NCCL_CHECK_ASYNC_NOTHROW(ncclResult_t{ncclInProgress}));
    log.logger->flush();
    const std::string text = log.stream.str();
    CHECK(text.find("cudaError_t{cudaErrorInvalidValue} failed: invalid argument") !=
          std::string::npos);
    CHECK(text.find("ncclResult_t{ncclSystemError} failed") != std::string::npos);
  }

  TEST_CASE("the device probe answers usable or gives the reason") {
    const auto probe = hmc::resources::cudaDeviceUsable();
    if (probe.usable) {
      CHECK(probe.deviceCount >= 1);
      CHECK(probe.reason.empty());
    } else {
      MESSAGE(probe.reason);
      CHECK(startsWith(probe.reason, "no usable CUDA device: "));
    }
  }

  TEST_CASE("the device registry counts live handles per kind and forgets released ones") {
    DeviceRegistry registry;
    const auto memory = registry.add(DeviceHandleKind::kMemory, 0, 1024, "rank 0 a");
    const auto stream = registry.add(DeviceHandleKind::kStream, 0, 0, "rank 0 a");
    registry.add(DeviceHandleKind::kEvent, 1, 0, "rank 1 b");
    registry.add(DeviceHandleKind::kCommunicator, 1, 0, "rank 1 nccl");
    auto snapshot = registry.snapshot();
    CHECK(snapshot.liveBytes == 1024);
    CHECK(snapshot.allocations == 1);
    CHECK(snapshot.streams == 1);
    CHECK(snapshot.events == 1);
    CHECK(snapshot.communicators == 1);
    CHECK(
        snapshot.toJson()["live"][0] ==
        nlohmann::json{{"kind", "memory"}, {"device", 0}, {"bytes", 1024}, {"owner", "rank 0 a"}});
    registry.remove(memory);
    registry.remove(memory);  // twice: ignored
    registry.remove(stream);
    snapshot = registry.snapshot();
    CHECK(snapshot.liveBytes == 0);
    CHECK(snapshot.streams == 0);
    CHECK(snapshot.live.size() == 2);
  }

  TEST_CASE("the nccl transport needs a bootstrap, and names the missing device") {
    hmc::collective::NcclTransportOptions options;
    CHECK_THROWS_AS(hmc::collective::NcclTransport{options}, hmc::ValueError);
    options.bootstrap = std::make_shared<hmc::collective::LocalCollective>();
    options.timeout = std::chrono::milliseconds(0);
    CHECK_THROWS_AS(hmc::collective::NcclTransport{options}, hmc::ValueError);
    options.timeout = std::chrono::seconds(60);
    const auto probe = hmc::resources::cudaDeviceUsable();
    if (!probe.usable) {
      try {
        hmc::collective::NcclTransport transport(options);
        FAIL("constructed without a usable device");
      } catch (const hmc::BackendError& error) {
        CHECK(startsWith(error.what(), "--transport nccl: no usable CUDA device: "));
      }
      return;
    }
    // A world of one on a GPU: the exchange goes through NCCL all the same.
    hmc::collective::NcclTransport transport(options);
    CHECK(transport.transportName() == "nccl");
    CHECK(transport.device() == 0);
    const auto first = transport.exchange("stage", std::string(1000, 'x'));
    REQUIRE(first.size() == 1);
    CHECK(first[0] == std::string(1000, 'x'));
    const auto second = transport.exchange("stage", "");
    REQUIRE(second.size() == 1);
    CHECK(second[0].empty());
    CHECK(transport.sequence() == 2);
    CHECK_FALSE(transport.aborted());
  }
}
