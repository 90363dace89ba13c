#include "local_launcher.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "hmc/error.hpp"

namespace hmc::app {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::atomic<int> gSignal{0};

extern "C" void onSignal(int signal) { gSignal.store(signal); }

// Installs SIGINT/SIGTERM handlers for the launch and restores the old ones after it.
class SignalScope {
 public:
  SignalScope() {
    gSignal.store(0);
    struct sigaction action {};
    action.sa_handler = onSignal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &oldInt_);
    sigaction(SIGTERM, &action, &oldTerm_);
  }
  ~SignalScope() {
    sigaction(SIGINT, &oldInt_, nullptr);
    sigaction(SIGTERM, &oldTerm_, nullptr);
  }

 private:
  struct sigaction oldInt_ {};
  struct sigaction oldTerm_ {};
};

int freePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw RuntimeError(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    const std::string reason = std::strerror(errno);
    close(fd);
    throw RuntimeError("cannot find a free loopback port: " + reason);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return code == 17 ? "exited with status 17 (fault crash)"
                      : fmt::format("exited with status {}", code);
  }
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return fmt::format("killed by signal {} ({})", signal, strsignal(signal));
  }
  return fmt::format("ended with wait status {}", status);
}

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw RuntimeError(fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    execv(argv[0], argv.data());
    std::fprintf(stderr, "hmc-run: cannot start rank process %s: %s\n", argv[0],
                 std::strerror(errno));
    _exit(127);
  }
  return pid;
}

}  // namespace

LocalLaunchResult launchLocalRanks(const scenario::Scenario& scenario,
                                   const LocalLaunchOptions& options) {
  const int world = scenario.worldSize;
  char pattern[] = "/tmp/hmc-run-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    throw RuntimeError(fmt::format("mkdtemp /tmp/hmc-run-XXXXXX: {}", std::strerror(errno)));
  }
  const fs::path dir(pattern);
  const int port = freePort();
  int glooPort = freePort();
  if (glooPort == port) glooPort = freePort();

  SignalScope signals;
  struct Child {
    pid_t pid = -1;
    std::optional<int> status;
  };
  std::vector<Child> children(world);
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> args = {options.executable,
                                     "_rank",
                                     options.scenarioFile,
                                     "--rank",
                                     std::to_string(rank),
                                     "--world-size",
                                     std::to_string(world),
                                     "--master-addr",
                                     "127.0.0.1",
                                     "--master-port",
                                     std::to_string(port),
                                     "--gloo-port",
                                     std::to_string(glooPort),
                                     "--transport",
                                     options.transport,
                                     "--result-file",
                                     (dir / fmt::format("rank{}.json", rank)).string()};
    args.insert(args.end(), options.passThrough.begin(), options.passThrough.end());
    children[rank].pid = spawn(args);
  }

  // Reap; after the first failure the survivors get two collective deadlines (the one that
  // notices the dead rank, then the bounded end-of-run agreement) plus a margin to finish,
  // then SIGTERM, then SIGKILL.
  const auto grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(2 * scenario.timeoutS + 5.0));
  std::optional<Clock::time_point> stopAt;
  std::optional<Clock::time_point> killAt;
  LocalLaunchResult result;
  int alive = world;
  while (alive > 0) {
    for (auto& child : children) {
      if (child.status) continue;
      int status = 0;
      const pid_t done = waitpid(child.pid, &status, WNOHANG);
      if (done == child.pid) {
        child.status = status;
        --alive;
        const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!clean && !stopAt) stopAt = Clock::now() + grace;
      }
    }
    if (alive == 0) break;
    const auto now = Clock::now();
    if (gSignal.load() != 0 && !result.interrupted) {
      result.interrupted = true;
      stopAt = now;
    }
    if (stopAt && now >= *stopAt && !killAt) {
      for (auto& child : children) {
        if (!child.status) kill(child.pid, SIGTERM);
      }
      killAt = now + std::chrono::seconds(2);
    }
    if (killAt && now >= *killAt) {
      for (auto& child : children) {
        if (!child.status) kill(child.pid, SIGKILL);
      }
      killAt = now + std::chrono::hours(1);  // SIGKILL once; waitpid reaps them next
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  result.ranks.resize(world);
  for (int rank = 0; rank < world; ++rank) {
    const fs::path file = dir / fmt::format("rank{}.json", rank);
    std::ifstream in(file);
    bool loaded = false;
    if (in) {
      try {
        result.ranks[rank] = scenario::RankResult::fromJson(nlohmann::json::parse(in));
        loaded = true;
      } catch (const std::exception& error) {
        spdlog::warn("rank {} wrote an unreadable result {}: {}", rank, file.string(),
                     error.what());
      }
    }
    if (!loaded) {
      result.ranks[rank].rank = rank;
      result.ranks[rank].crashed = true;
      result.ranks[rank].crashReason = describeStatus(*children[rank].status);
      result.ranks[rank].leaks.reason = "the rank process died without a result: not checked";
    } else if (result.ranks[rank].crashed) {
      result.ranks[rank].crashReason = describeStatus(*children[rank].status);
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return result;
}

}  // namespace hmc::app
