#include "local_launcher.hpp"

#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/spdlog.h>
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
#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/error.hpp"
#include "process_group.hpp"
#include "rank_process.hpp"
#include "signals.hpp"
#include "status_command.hpp"

namespace hmc::app {
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
    const std::string key = diagnostics::heartbeatKey(rank);
    if (!kv.check({key})) return;
    try {
      auto beat = diagnostics::Heartbeat::fromJson(
          nlohmann::json::parse(kv.get(key, std::chrono::milliseconds(500))));
      std::lock_guard<std::mutex> guard(mutex_);
      heartbeats_[rank] = std::move(beat);
    } catch (const nlohmann::json::exception& error) {
      spdlog::debug("launcher: rank {}'s heartbeat is unreadable: {}", rank, error.what());
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

 private:
  fs::path path_;
};

// A rank's result of one repetition, as it wrote it (runRankProcess), or nullopt when the
// file is missing or unreadable.
std::optional<scenario::RankResult> readRankResult(const fs::path& file, int rank) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  try {
    auto results = parseRankResults(std::string(std::istreambuf_iterator<char>(in), {}));
    if (results.size() == 1) return std::move(results.front());
    spdlog::warn("rank {} wrote {} results to {}, not one", rank, results.size(), file.string());
  } catch (const std::exception& error) {
    spdlog::warn("rank {} wrote an unreadable result {}: {}", rank, file.string(), error.what());
  }
  return std::nullopt;
}

// The ranks' result files, one per rank and repetition: hands each repetition on once every
// rank wrote its own, and removes them, so that neither the launcher nor the run folder grows
// with the repetitions.
class RepetitionFiles {
 public:
  RepetitionFiles(const RunFolder& folder, int world,
                  const std::function<void(std::vector<scenario::RankResult>)>& onRepetition)
      : folder_(folder), world_(world), onRepetition_(onRepetition) {}

  // The result file stem of `rank` (RankLaunch::resultFile).
  std::string stem(int rank) const { return (folder_ / fmt::format("rank{}", rank)).string(); }

  // Hands on the next repetitions that every rank has written, in order.
  void handOnReady() {
    for (;;) {
      std::vector<fs::path> files;
      for (int rank = 0; rank < world_; ++rank) {
        files.emplace_back(repetitionResultFile(stem(rank), next_));
        std::error_code ec;
        if (!fs::exists(files.back(), ec)) return;
      }
      std::vector<scenario::RankResult> ranks;
      for (int rank = 0; rank < world_; ++rank) {
        auto result = readRankResult(files[rank], rank);
        if (!result) return;  // read once every rank has exited (rest())
        ranks.push_back(std::move(*result));
      }
      hand(std::move(ranks));
    }
  }

  // The results `rank` wrote from the next repetition on, up to its first missing or
  // unreadable file.
  std::vector<scenario::RankResult> rest(int rank) const {
    std::vector<scenario::RankResult> results;
    for (std::size_t r = next_;; ++r) {
      auto result = readRankResult(repetitionResultFile(stem(rank), r), rank);
      if (!result) return results;
      results.push_back(std::move(*result));
    }
  }

  // Hands on the next repetition and removes its files.
  void hand(std::vector<scenario::RankResult> ranks) {
    if (onRepetition_) onRepetition_(std::move(ranks));
    for (int rank = 0; rank < world_; ++rank) {
      std::error_code ec;
      fs::remove(repetitionResultFile(stem(rank), next_), ec);
    }
    ++next_;
  }
  std::size_t handedOn() const noexcept { return next_; }

 private:
  const RunFolder& folder_;
  int world_;
  const std::function<void(std::vector<scenario::RankResult>)>& onRepetition_;
  std::size_t next_ = 0;
};

// A dead rank's last heartbeat in its result: its last completed collective and the one it was
// in, for the hang diagnosis ("last completed 'recycle' #80"), and where it was.
void addHeartbeat(scenario::RankResult& slot, const diagnostics::Heartbeat& beat) {
  if (beat.lastCompleted) slot.flight.push_back(*beat.lastCompleted);
  if (beat.current &&
      (!beat.lastCompleted || beat.current->sequence != beat.lastCompleted->sequence)) {
    slot.flight.push_back(*beat.current);
  }
  *slot.crashReason += beat.step < 0 ? fmt::format("; last heartbeat ({}): outside its steps",
                                                   diagnostics::toString(beat.state))
                                     : fmt::format("; last heartbeat ({}): in step {}",
                                                   diagnostics::toString(beat.state), beat.step);
}

}  // namespace

LocalLaunchResult launchLocalRanks(const scenario::Scenario& scenario,
                                   const LocalLaunchOptions& options) {
  const int world = scenario.worldSize;
  const RunFolder folder;
  const fs::path scenarioCopy = folder / "scenario.json";
  {
    std::ofstream out(scenarioCopy, std::ios::binary);
    out << options.scenarioText;
    if (!out.flush()) {
      throw RuntimeError(
          fmt::format("cannot write {}: {}", scenarioCopy.string(), std::strerror(errno)));
    }
  }
  // --master-port, else a free port; said on stderr so that `hmc-run status` can attach.
  const int port = options.masterPort ? *options.masterPort : collective::freeLoopbackPort();
  printStoreAddress(stderr, "127.0.0.1", port);
  int glooPort = collective::freeLoopbackPort();
  if (glooPort == port) glooPort = collective::freeLoopbackPort();

  RepetitionFiles files(folder, world, options.onRepetition);
  // The caller's SignalScope records Ctrl-C, SIGTERM and SIGHUP (pendingSignal()).
  ProcessGroup ranks;
  for (int rank = 0; rank < world; ++rank) {
    RankLaunch launch = options.launch;
    launch.scenarioFile = scenarioCopy.string();
    launch.rank = rank;
    launch.worldSize = world;
    launch.masterAddr = "127.0.0.1";
    launch.masterPort = port;
    launch.glooPort = glooPort;
    launch.agentHostsStore = false;
    launch.resultFile = files.stem(rank);
    std::vector<std::string> args = launch.toArgs();
    args.insert(args.begin(), options.executable);
    ranks.spawn(args);
  }
  {
    std::vector<pid_t> pids;
    for (int rank = 0; rank < world; ++rank) pids.push_back(ranks.pid(rank));
    writePidFile(pids);
  }
  // Rank 0 starts its server once LibTorch is loaded; every rank gives up on the store after
  // the join timeout, so the launcher does not try longer than that plus a margin.
  // One liaison per store of the run: the control store (prefix "hmc"), and for gloo the
  // process group's own store (GlooTransport's prefix "hmc-gloo/gloo"), whose rendezvous and
  // leaving also skip ranks announced dead.
  const auto timeout = collective::timeoutFromSeconds(scenario.timeoutS);
  std::optional<StoreLiaison> liaison;
  std::optional<StoreLiaison> glooLiaison;
  if (world > 1) {
    const auto connectFor = options.launch.joinTimeout() + std::chrono::seconds(10);
    liaison.emplace(port, "hmc", world, connectFor);
    if (options.launch.transport == collective::Transport::kGloo) {
      glooLiaison.emplace(glooPort, "hmc-gloo/gloo", world, connectFor);
    }
  }

  // Reap; after the first failure the survivors get two collective deadlines (the one that
  // notices the dead rank, then the bounded end-of-run agreement) plus a margin to finish,
  // then SIGTERM, then SIGKILL.
  const auto grace = 2 * timeout + std::chrono::seconds(5);
  // A rank stopped from outside (SIGSTOP) neither progresses nor exits: its peers time out,
  // and nothing else would end the run. One seen stopped for longer than the deadline counts
  // as failed (the others get the grace); once every running rank is, they are stopped at
  // once (ProcessGroup's SIGTERM comes with SIGCONT, so each can still write what it did).
  // Only ranks seen stopped at two polls a deadline apart: a Ctrl-Z of the whole job stops
  // this loop too, and a rank continued in between starts over.
  std::vector<std::optional<ProcessGroup::Clock::time_point>> stoppedSince(world);
  auto nextStopCheck = ProcessGroup::Clock::now();
  LocalLaunchResult result;
  while (ranks.running() > 0) {
    if (const auto now = ProcessGroup::Clock::now(); now >= nextStopCheck) {
      nextStopCheck = now + std::chrono::milliseconds(100);
      bool anyStuck = false;
      bool allStuck = true;
      for (int rank = 0; rank < world; ++rank) {
        if (ranks.status(rank)) continue;
        if (!processStopped(ranks.pid(rank))) {
          stoppedSince[rank].reset();
          allStuck = false;
          continue;
        }
        if (!stoppedSince[rank]) stoppedSince[rank] = now;
        const bool stuck = now - *stoppedSince[rank] >= timeout;
        anyStuck = anyStuck || stuck;
        allStuck = allStuck && stuck;
      }
      if (anyStuck && !ranks.stopping()) {
        spdlog::warn("a rank process stays stopped (SIGSTOP?) past the deadline: the run ends "
                     "within {} s", std::chrono::duration_cast<std::chrono::seconds>(grace).count());
        ranks.stopAt(now + grace);
      }
      if (anyStuck && allStuck) ranks.stopNow();
    }
    for (int rank : ranks.poll()) {
      const int status = *ranks.status(rank);
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      for (auto* store : {&liaison, &glooLiaison}) {
        if (!*store) continue;
        if (rank == 0) (*store)->storeGone();
        if (!clean && !result.interrupted) {
          (*store)->announceDeath(
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

  const auto flights = liaison ? liaison->flights() : std::map<int, diagnostics::PublishedFlight>{};
  const auto heartbeats =
      liaison ? liaison->lastHeartbeats() : std::map<int, diagnostics::Heartbeat>{};
  liaison.reset();
  glooLiaison.reset();
  // The repetitions not every rank finished (and the first one, when no rank wrote any).
  std::vector<std::vector<scenario::RankResult>> byRank(world);
  std::size_t repetitions = files.handedOn() == 0 ? 1 : 0;
  for (int rank = 0; rank < world; ++rank) {
    byRank[rank] = files.rest(rank);
    repetitions = std::max(repetitions, byRank[rank].size());
  }
  // A rank that died in repetition k left results for the ones before: it is missing from k on.
  std::vector<std::vector<scenario::RankResult>> rest(repetitions,
                                                      std::vector<scenario::RankResult>(world));
  for (int rank = 0; rank < world; ++rank) {
    const std::string status = describeWaitStatus(*ranks.status(rank), kCrashExitStatus);
    for (std::size_t r = 0; r < repetitions; ++r) {
      auto& slot = rest[r][rank];
      if (r < byRank[rank].size()) {
        slot = std::move(byRank[rank][r]);  // a rank stopped by a signal says where itself
      } else {
        // Where it was, if its watchdog published its flight record before it died.
        slot = missingRankResult(rank, status,
                                 "the rank process died without a result: not checked", flights);
        // No flight record published: its last heartbeat says what it had completed.
        if (auto beat = heartbeats.find(rank); slot.flight.empty() && beat != heartbeats.end()) {
          addHeartbeat(slot, beat->second);
        }
      }
    }
  }
  for (auto& ranksOfRepetition : rest) files.hand(std::move(ranksOfRepetition));
  result.repetitions = files.handedOn();
  return result;
}

}  // namespace hmc::app
