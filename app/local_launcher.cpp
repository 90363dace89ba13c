#include "local_launcher.hpp"

#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/error.hpp"
#include "rank_process.hpp"
#include "status_command.hpp"  // hook (issue 9 item 5): the store's address

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

std::string describeStatus(int status) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return code == kCrashExitStatus ? fmt::format("exited with status {} (fault crash)", code)
                                    : fmt::format("exited with status {}", code);
  }
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return fmt::format("killed by signal {} ({})", signal, strsignal(signal));
  }
  return fmt::format("ended with wait status {}", status);
}

// Whether something listens on 127.0.0.1:port now.
bool acceptsConnections(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
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

// The launcher's own connection to the store that rank 0 hosts. It announces dead ranks
// ("dead/<rank>", so the survivors raise rank_failure instead of waiting for the deadline) and
// keeps copies of the flight records ranks publish (the store dies with rank 0, before the
// launcher reads the results). A thread of its own: connecting must wait for rank 0's server
// (bounded by `connectFor`), and the reap loop must never block on the store.
class StoreLiaison {
 public:
  StoreLiaison(int port, std::string prefix, int worldSize, std::chrono::milliseconds connectFor)
      : worldSize_(worldSize), connectUntil_(Clock::now() + connectFor) {
    options_.host = "127.0.0.1";
    options_.port = port;
    options_.worldSize = worldSize;
    options_.prefix = std::move(prefix);
    thread_ = std::thread([this] { run(); });
  }
  ~StoreLiaison() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void announceDeath(int rank, std::string why) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      deaths_.emplace_back(rank, std::move(why));
    }
    wake_.notify_all();
  }
  // Rank 0 exited: its store server is gone.
  void storeGone() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gone_ = true;
    }
    wake_.notify_all();
  }
  std::map<int, diagnostics::PublishedFlight> flights() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return flights_;
  }

 private:
  bool stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stop_ || gone_;
  }

  void run() {
    std::shared_ptr<collective::KeyValueStore> kv;
    // Probe the port with a plain connect first: c10d logs every failed attempt.
    while (!kv && !stopping() && Clock::now() < connectUntil_) {
      if (!acceptsConnections(options_.port)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      collective::StoreTransportOptions attempt = options_;
      attempt.timeout = std::chrono::seconds(2);
      try {
        kv = collective::connectKeyValueStore(attempt);
      } catch (const Error& error) {
        spdlog::debug("launcher: cannot join the store at 127.0.0.1:{}: {}", options_.port,
                      error.what());
        return;
      }
    }
    if (!kv) return;
    std::int64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait_for(lock, std::chrono::milliseconds(100),
                     [&] { return stop_ || gone_ || !deaths_.empty(); });
      if (gone_) return;
      auto deaths = std::move(deaths_);
      deaths_.clear();
      const bool last = stop_;
      lock.unlock();
      try {
        for (const auto& [rank, why] : deaths) collective::announceDeadRank(*kv, rank, why);
        const std::int64_t count = kv->add(collective::kFlightPublishedKey, 0);
        if (count != seen) {
          seen = count;
          auto read = diagnostics::readPublishedFlights(*kv, worldSize_);
          std::lock_guard<std::mutex> guard(mutex_);
          for (auto& [rank, flight] : read) flights_[rank] = std::move(flight);
        }
      } catch (const std::exception& error) {
        spdlog::debug("launcher: the store at 127.0.0.1:{} failed: {}", options_.port,
                      error.what());
        return;
      }
      if (last) return;
      lock.lock();
    }
  }

  collective::StoreTransportOptions options_;
  int worldSize_;
  Clock::time_point connectUntil_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool gone_ = false;
  std::deque<std::pair<int, std::string>> deaths_;
  std::map<int, diagnostics::PublishedFlight> flights_;
  std::thread thread_;
};

// HMC_LAUNCH_PID_FILE (a test hook): the rank processes' pids, one a line, in rank order.
void writePidFile(const std::vector<pid_t>& pids) {
  const char* path = std::getenv("HMC_LAUNCH_PID_FILE");
  if (path == nullptr || *path == '\0') return;
  std::ofstream out(path, std::ios::trunc);
  for (pid_t pid : pids) out << pid << '\n';
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
  // hook (issue 9 item 5): honour --master-port, and say where to attach `hmc-run status`.
  const int port = options.masterPort != 0 ? options.masterPort : collective::freeLoopbackPort();
  printStoreAddress(stderr, "127.0.0.1", port);
  int glooPort = collective::freeLoopbackPort();
  if (glooPort == port) glooPort = collective::freeLoopbackPort();

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
  {
    std::vector<pid_t> pids;
    for (const auto& child : children) pids.push_back(child.pid);
    writePidFile(pids);
  }
  // Rank 0 starts its server once LibTorch is loaded; every rank gives up on the store after
  // the timeout, so the launcher does not try longer than that plus a margin.
  // One liaison per store of the run: rank_process.cpp's control store (prefix "hmc"), and
  // for gloo the process group's own store (GlooTransport's prefix "hmc-gloo/gloo"), whose
  // rendezvous and leaving also skip ranks announced dead.
  std::optional<StoreLiaison> liaison;
  std::optional<StoreLiaison> glooLiaison;
  if (world > 1) {
    const auto connectFor =
        collective::timeoutFromSeconds(scenario.timeoutS) + std::chrono::seconds(10);
    liaison.emplace(port, "hmc", world, connectFor);
    if (options.transport == "gloo")
      glooLiaison.emplace(glooPort, "hmc-gloo/gloo", world, connectFor);
  }

  // Reap; after the first failure the survivors get two collective deadlines (the one that
  // notices the dead rank, then the bounded end-of-run agreement) plus a margin to finish,
  // then SIGTERM, then SIGKILL.
  const auto grace = 2 * collective::timeoutFromSeconds(scenario.timeoutS) + std::chrono::seconds(5);
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
        const int rank = static_cast<int>(&child - children.data());
        for (auto* store : {&liaison, &glooLiaison}) {
          if (!*store) continue;
          if (rank == 0) (*store)->storeGone();
          if (!clean && !result.interrupted) {
            (*store)->announceDeath(rank, fmt::format("rank {} {}", rank, describeStatus(status)));
          }
        }
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

  const auto flights = liaison ? liaison->flights() : std::map<int, diagnostics::PublishedFlight>{};
  liaison.reset();
  glooLiaison.reset();
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
      // Where it was, if its watchdog published its flight record before it died.
      result.ranks[rank] =
          missingRankResult(rank, describeStatus(*children[rank].status),
                            "the rank process died without a result: not checked", flights);
    } else if (result.ranks[rank].crashed) {
      result.ranks[rank].crashReason = describeStatus(*children[rank].status);
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return result;
}

}  // namespace hmc::app
