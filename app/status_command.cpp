#include "status_command.hpp"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>

#include "exit_codes.hpp"
#include "hmc/diagnostics/hang_diagnosis.hpp"
#include "hmc/diagnostics/job_status.hpp"
#include "hmc/error.hpp"
#include "hmc/text.hpp"

namespace hmc::app {
namespace {

constexpr int kExitProgressing = 0;
constexpr int kExitHung = 3;

// Connects a plain TCP socket to host:port within `timeout`; "" on success, else why not.
std::string probe(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc));
  }
  std::string why = "no address";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (addrinfo* at = found; at != nullptr; at = at->ai_next) {
    const int fd = socket(at->ai_family, at->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int rc = connect(fd, at->ai_addr, at->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      const int ready = poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
      if (ready == 1) {
        int error = 0;
        socklen_t size = sizeof error;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
        rc = error == 0 ? 0 : -1;
        errno = error;
      } else {
        if (ready == 0) errno = ETIMEDOUT;
        rc = -1;
      }
    }
    const int error = errno;
    close(fd);
    if (rc == 0) {
      freeaddrinfo(found);
      return "";
    }
    why = std::strerror(error);
  }
  freeaddrinfo(found);
  return why;
}

std::string cell(const std::optional<std::string>& text) { return text.value_or("-"); }

void printTable(const diagnostics::JobStatus& status, double elapsedS) {
  const auto& meta = status.meta;
  fmt::print("# hmc-run status: job '{}' at {}: {} ranks, transport {}, deadline {:g} s\n",
             meta.scenario, status.endpoint, meta.worldSize, meta.transport, meta.timeoutS);
  if (status.firstFailure) fmt::print("# first failure: {}\n", status.firstFailure->line);
  fmt::print("# {:>4}  {:<8} {:>4}  {:<28} {:>5} {:>10}  {:<32}  {}\n", "rank", "state", "step",
             "stage", "seq", "in_stage_s", "last_completed", "host:pid");
  for (const auto& rank : status.ranks) {
    if (!rank.heartbeat) {
      fmt::print("  {:>4}  {:<8} {:>4}  {:<28} {:>5} {:>10}  {:<32}  {}\n", rank.rank,
                 rank.dead ? "dead" : "unknown", "-", "-", "-", "-", "-", "-");
      continue;
    }
    const auto& beat = *rank.heartbeat;
    std::string state(diagnostics::toString(beat.state));
    if (rank.dead) state = "dead";
    if (rank.stale) state = "silent";
    std::optional<std::string> stage;
    std::optional<std::string> sequence;
    // The collective it is in, or the one it left waiting (timeout, rank_failure).
    if (beat.current && diagnostics::isWaitStatus(beat.current->status)) {
      stage = beat.current->status == "in_flight"
                  ? beat.current->stage
                  : fmt::format("{} ({})", beat.current->stage, beat.current->status);
      sequence = std::to_string(beat.current->sequence);
    }
    // "(step N)" within a scenario's steps; a program's collectives, and a scenario's after
    // its steps, have none (-1, which said nothing).
    const std::string last =
        !beat.lastCompleted ? std::string("-")
        : beat.lastCompleted->step < 0
            ? fmt::format("'{}' #{}", beat.lastCompleted->stage, beat.lastCompleted->sequence)
            : fmt::format("'{}' #{} (step {})", beat.lastCompleted->stage,
                          beat.lastCompleted->sequence, beat.lastCompleted->step);
    // Where it runs ("-": a heartbeat of an older hmc-run names no host).
    const std::string where =
        beat.host.empty() ? std::string("-") : fmt::format("{}:{}", printable(beat.host), beat.pid);
    fmt::print("  {:>4}  {:<8} {:>4}  {:<28} {:>5} {:>10.1f}  {:<32}  {}\n", rank.rank, state,
               beat.step < 0 ? std::string("-") : std::to_string(beat.step), cell(stage),
               cell(sequence), rank.inStageS, last, where);
  }
  if (!status.diagnosis.empty()) fmt::print("# waits: {}\n", status.diagnosis);
  if (status.hung) {
    for (const auto& rank : status.ranks) {
      if (!rank.problem.empty()) fmt::print("# {}\n", rank.problem);
    }
    fmt::print("# HUNG: some rank does not progress (exit {})\n", kExitHung);
  } else {
    fmt::print("# OK: every rank is progressing\n");
  }
  fmt::print("# attached and read {} heartbeats in {:.3f} s\n", status.ranks.size(), elapsedS);
}

}  // namespace

int runStatus(const StatusOptions& options, const StoreConnector& connect) {
  const auto start = std::chrono::steady_clock::now();
  const auto timeout = options.timeout;
  const std::string endpoint = fmt::format("{}:{}", options.masterAddr, options.masterPort);
  if (const std::string why = probe(options.masterAddr, options.masterPort, timeout);
      !why.empty()) {
    fmt::print(stderr,
               "hmc-run status: cannot reach the job's store at {}: {}; is the job running, and "
               "are --master-addr/--master-port those of its rank 0 (hmc-run prints \"# hmc-run: "
               "store at ...\")?\n",
               endpoint, why);
    return kExitUsage;
  }
  diagnostics::JobStatus status;
  try {
    // A plain client: connecting writes no key (no worker count, no wait for workers).
    auto store = connect(options.masterAddr, options.masterPort, options.prefix, timeout);
    status = diagnostics::readJobStatus(*store, endpoint, timeout);
  } catch (const Error& error) {
    fmt::print(stderr, "hmc-run status: {}\n", error.what());  // names host:port itself
    return kExitUsage;
  }
  const double elapsedS =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.json) {
    auto document = status.toJson();
    document["exit_code"] = status.hung ? kExitHung : kExitProgressing;
    document["elapsed_s"] = elapsedS;  // attaching and reading, after the process started
    std::cout << document.dump(2) << std::endl;
  } else {
    printTable(status, elapsedS);
  }
  return status.hung ? kExitHung : kExitProgressing;
}

}  // namespace hmc::app
