#include "hmc/world/local_launcher.hpp"

#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/transport_factory.hpp"
#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"
#include "hmc/world/missing_ranks.hpp"
#include "hmc/world/process_group.hpp"
#include "hmc/world/rank_process.hpp"
#include "hmc/world/result_files.hpp"
#include "hmc/world/signals.hpp"

namespace hmc::world {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

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
  // The last heartbeat of each rank announced dead, read as its death was announced (the
  // store dies with rank 0 before the launcher reads the results).
  std::map<int, diagnostics::Heartbeat> lastHeartbeats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return heartbeats_;
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
        for (const auto& [rank, why] : deaths) {
          collective::announceDeadRank(*kv, rank, why);
          readHeartbeat(*kv, rank);
        }
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

  void readHeartbeat(collective::KeyValueStore& kv, int rank) {
    std::string problem;
    auto beat = diagnostics::readHeartbeat(kv, rank, std::chrono::milliseconds(500), &problem);
    if (!beat) {
      if (!problem.empty())
        spdlog::debug("launcher: rank {}'s heartbeat is unreadable: {}", rank, problem);
      return;
    }
    std::lock_guard<std::mutex> guard(mutex_);
    heartbeats_[rank] = std::move(*beat);
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
  std::map<int, diagnostics::Heartbeat> heartbeats_;
  std::thread thread_;
};

// HMC_LAUNCH_PID_FILE (a test hook): the rank processes' pids, one a line, in rank order.
void writePidFile(const std::vector<pid_t>& pids) {
  const char* path = std::getenv("HMC_LAUNCH_PID_FILE");
  if (path == nullptr || *path == '\0') return;
  std::ofstream out(path, std::ios::trunc);
  for (pid_t pid : pids) out << pid << '\n';
}

// Whether the process is stopped (SIGSTOP, SIGTSTP: state T in /proc/PID/stat).
bool processStopped(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  const std::string stat((std::istreambuf_iterator<char>(in)), {});
  const auto name = stat.rfind(')');
  return name != std::string::npos && name + 2 < stat.size() && stat[name + 2] == 'T';
}

// A private folder for the run's result files: under $TMPDIR (else /tmp), removed at the end.
class RunFolder {
 public:
  RunFolder() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        (fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / "hmc-run-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw RuntimeError(
          fmt::format("cannot create a folder for the rank results: mkdtemp {}: {} "
                      "(set TMPDIR to a writable folder)",
                      pattern, std::strerror(errno)));
    }
    path_ = pattern;
  }
  ~RunFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const noexcept { return path_; }

 private:
  fs::path path_;
};

// A rank stopped from outside (SIGSTOP) neither progresses nor exits: its peers time out, and
// nothing else would end the run. One seen stopped for longer than the deadline counts as
// failed (the others get the grace); once every running rank is, they are stopped at once
// (ProcessGroup's SIGTERM comes with SIGCONT, so each can still write what it did). Only ranks
// seen stopped at two polls a deadline apart: a Ctrl-Z of the whole job stops the launcher's
// loop too, and a rank continued in between starts over.
class StoppedRanks {
 public:
  StoppedRanks(int world, std::chrono::milliseconds timeout, ProcessGroup::Clock::duration grace)
      : stoppedSince_(world), timeout_(timeout), grace_(grace) {}

  // Every 100 ms: looks at the running ranks and stops the group when they stay stopped.
  void check(ProcessGroup& ranks) {
    const auto now = ProcessGroup::Clock::now();
    if (now < nextCheck_) return;
    nextCheck_ = now + std::chrono::milliseconds(100);
    bool anyStuck = false;
    bool allStuck = true;
    for (int rank = 0; rank < static_cast<int>(stoppedSince_.size()); ++rank) {
      if (ranks.status(rank)) continue;
      if (!processStopped(ranks.pid(rank))) {
        stoppedSince_[rank].reset();
        allStuck = false;
        continue;
      }
      if (!stoppedSince_[rank]) stoppedSince_[rank] = now;
      const bool stuck = now - *stoppedSince_[rank] >= timeout_;
      anyStuck = anyStuck || stuck;
      allStuck = allStuck && stuck;
    }
    if (anyStuck && !ranks.stopping()) {
      spdlog::warn(
          "a rank process stays stopped (SIGSTOP?) past the deadline: the run ends "
          "within {} s",
          std::chrono::duration_cast<std::chrono::seconds>(grace_).count());
      ranks.stopAt(now + grace_);
    }
    if (anyStuck && allStuck) ranks.stopNow();
  }

 private:
  std::vector<std::optional<ProcessGroup::Clock::time_point>> stoppedSince_;
  std::chrono::milliseconds timeout_;
  ProcessGroup::Clock::duration grace_;
  ProcessGroup::Clock::time_point nextCheck_ = ProcessGroup::Clock::now();
};

// The run's copy of the scenario's bytes, which every rank process reads.
fs::path writeScenarioCopy(const RunFolder& folder, const std::string& text) {
  const fs::path copy = folder / "scenario.json";
  std::ofstream out(copy, std::ios::binary);
  out << text;
  if (!out.flush()) {
    throw RuntimeError(fmt::format("cannot write {}: {}", copy.string(), std::strerror(errno)));
  }
  return copy;
}

// Starts rank 0 .. world-1 with their places (rank 0 hosts the store on `port`).
// Forked ranks start together, once every one exists, as exec'd ones do (loading LibTorch
// takes longer than the forks): a rank that started its threads at once could take the tasks a
// later fork needs under a tight `ulimit -u`, and that rank would never start (with the gate,
// each rank starts and reports the limit it ran into). A pipe: each child closes its copy of
// the write end and waits for the end of file that the parent's close makes.
class StartGate {
 public:
  explicit StartGate(bool wanted) {
    if (wanted && pipe(ends_) != 0) {
      throw RuntimeError(fmt::format("cannot start the rank processes: pipe: {}",
                                     std::strerror(errno)));
    }
  }
  ~StartGate() { open(); }
  StartGate(const StartGate&) = delete;
  StartGate& operator=(const StartGate&) = delete;
  // In a child: blocks until the parent opened the gate (or died).
  void wait() {
    if (ends_[1] >= 0) close(ends_[1]);
    char byte = 0;
    while (ends_[0] >= 0 && read(ends_[0], &byte, 1) < 0 && errno == EINTR) {
    }
    if (ends_[0] >= 0) close(ends_[0]);
  }
  // In the parent: every child goes.
  void open() {
    for (int& end : ends_) {
      if (end >= 0) close(end);
      end = -1;
    }
  }

 private:
  int ends_[2] = {-1, -1};
};

void spawnRanks(ProcessGroup& ranks, const LocalLaunchOptions& options, int world,
                const fs::path& scenarioCopy, int port, int glooPort,
                const RepetitionFiles& files) {
  StartGate gate(static_cast<bool>(options.rankBody));
  for (int rank = 0; rank < world; ++rank) {
    RankLaunch launch = options.launch;
    launch.scenarioFile = scenarioCopy.string();
    launch.placement =
        RankPlacement{rank, world, "127.0.0.1", port, glooPort, StoreHost::kRankZero, ""};
    launch.resultFile = files.stem(rank);
    if (options.rankBody) {
      ranks.spawn([&options, &launch, &gate, rank] {
        const std::string name = fmt::format("hmc-rank-{}", rank);
        prctl(PR_SET_NAME, name.c_str());
        gate.wait();
        return options.rankBody(launch);
      });
      continue;
    }
    std::vector<std::string> args = launch.toArgs();
    args.insert(args.begin(), options.executable);
    ranks.spawn(args);
  }
  gate.open();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) pids.push_back(ranks.pid(rank));
  writePidFile(pids);
}

}  // namespace

LocalLaunchResult launchLocalRanks(const scenario::Scenario& scenario,
                                   const LocalLaunchOptions& options) {
  const int world = scenario.worldSize;
  const RunFolder folder;
  const fs::path scenarioCopy = writeScenarioCopy(folder, options.scenarioText);
  // --master-port, else a free port; said on stderr so that `hmc-run status` can attach. The
  // ports that hmc-run picks are held until the world ends (collective::PortReservation):
  // freed, another job's bind to port 0 or an outgoing connection could take them before
  // rank 0's store binds them, and rank 0 would fail with the port "already in use".
  std::vector<collective::PortReservation> held;
  const auto reserve = [&held] {
    return held.emplace_back(collective::PortReservation::loopback()).port();
  };
  const int port = options.masterPort ? *options.masterPort : reserve();
  printStoreAddress(stderr, "127.0.0.1", port);
  int glooPort = reserve();
  if (glooPort == port) glooPort = reserve();  // the kernel may pick --master-port's number

  RepetitionFiles files(folder.path(), world, options.onRepetition);
  // The caller's SignalScope records Ctrl-C, SIGTERM and SIGHUP (pendingSignal()).
  ProcessGroup ranks;
  spawnRanks(ranks, options, world, scenarioCopy, port, glooPort, files);
  // Rank 0 starts its server once LibTorch is loaded; every rank gives up on the store after
  // the join timeout, so the launcher does not try longer than that plus a margin. One
  // liaison per store of the world (collective::worldStores).
  const auto timeout = scenario.timeout();
  std::vector<std::unique_ptr<StoreLiaison>> liaisons;
  if (world > 1) {
    RankLaunch any = options.launch;
    any.placement = RankPlacement{0, world, "127.0.0.1", port, glooPort, StoreHost::kRankZero, ""};
    for (const auto& store :
         collective::worldStores(any.transport, any.transportOptions(timeout))) {
      liaisons.push_back(
          std::make_unique<StoreLiaison>(store.port, store.prefix, world,
                                         options.launch.joinTimeout + std::chrono::seconds(10)));
    }
  }

  // Reap; after the first failure the survivors get two collective deadlines (the one that
  // notices the dead rank, then the bounded end-of-run agreement) plus a margin to finish,
  // then SIGTERM, then SIGKILL.
  const auto grace = 2 * timeout + std::chrono::seconds(5);
  StoppedRanks stopped(world, timeout, grace);
  LocalLaunchResult result;
  while (ranks.running() > 0) {
    stopped.check(ranks);
    for (int rank : ranks.poll()) {
      const int status = *ranks.status(rank);
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      for (auto& store : liaisons) {
        if (rank == 0) store->storeGone();
        if (!clean && !result.interrupted) {
          store->announceDeath(
              rank, fmt::format("rank {} {}", rank, describeWaitStatus(status, kCrashExitStatus)));
        }
      }
      if (!clean) ranks.stopAt(ProcessGroup::Clock::now() + grace);
    }
    if (pendingSignal() != 0 && !result.interrupted) {
      result.interrupted = true;
      ranks.stopNow();
    }
    files.handOnReady();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  files.handOnReady();

  // The control store's liaison kept what the ranks published before the store died with
  // rank 0: flight records, and the last heartbeat of each rank announced dead.
  const auto flights = liaisons.empty() ? std::map<int, diagnostics::PublishedFlight>{}
                                        : liaisons.front()->flights();
  const auto heartbeats = liaisons.empty() ? std::map<int, diagnostics::Heartbeat>{}
                                           : liaisons.front()->lastHeartbeats();
  liaisons.clear();
  // The repetitions not every rank finished (and the first one, when no rank wrote any). A
  // rank that died in repetition k left results for the ones before: it is missing from k on,
  // crashed with its exit status, where its last heartbeat or flight record says it was.
  std::vector<std::vector<scenario::RankResult>> byRank(world);
  for (int rank = 0; rank < world; ++rank) byRank[rank] = files.rest(rank);
  const EvidenceOf evidenceOf = [&](int rank) {
    MissingRankEvidence evidence;
    evidence.reason = describeWaitStatus(*ranks.status(rank), kCrashExitStatus);
    evidence.leakReason = "the rank process died without a result: not checked";
    evidence.ended = true;
    evidence.host = hostName();
    evidence.pid = ranks.pid(rank);
    if (auto beat = heartbeats.find(rank); beat != heartbeats.end()) {
      evidence.heartbeat = beat->second;
    }
    if (auto flight = flights.find(rank); flight != flights.end()) evidence.flight = flight->second;
    return evidence;
  };
  for (auto& ranksOfRepetition :
       fillMissing(std::move(byRank), files.handedOn() == 0 ? 1 : 0, evidenceOf)) {
    files.hand(std::move(ranksOfRepetition));
  }
  result.repetitions = files.handedOn();
  return result;
}

void printStoreAddress(std::FILE* out, const std::string& host, int port) {
  fmt::print(out, "# hmc-run: store at {}:{} (attach: hmc-run status --master-port {})\n", host,
             port, port);
  std::fflush(out);
}

}  // namespace hmc::world
