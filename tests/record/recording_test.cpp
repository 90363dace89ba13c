// The recording file (hmc/record/recording.hpp) and the merge (hmc/record/merge.hpp): written,
// read back, cut short as a kill would, torn, foreign, capped; ranks merged into steps.
#include "hmc/record/recording.hpp"

#include <doctest/doctest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "hmc/error.hpp"
#include "hmc/record/merge.hpp"
#include "hmc/record/show.hpp"
#include "hmc/scenario/scenario.hpp"

namespace {

using hmc::record::EventOp;
using hmc::record::Outcome;
using nlohmann::json;

struct TempDir {
  std::string path;
  TempDir() {
    char pattern[] = "/tmp/hmc-record-test-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void writeAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A rank's small program: a module created, bound, closed with a hang at the end. `end`
// false: the program is killed (SIGKILL, in a child process) after its last call. `hangKind`:
// how the hang ended (timeout; rank_failure: it saw a peer fail).
void recordRank(const std::string& dir, int rank, bool hang, bool end = true,
                const char* hangKind = "timeout") {
  pid_t child = 0;
  if (!end) {
    child = ::fork();
    REQUIRE(child >= 0);
    if (child > 0) {
      int status = 0;
      ::waitpid(child, &status, 0);
      REQUIRE(WIFSIGNALED(status));
      return;
    }
  }
  auto recorder = hmc::record::openRankRecording(dir, rank, 2, "prog", 5.0, 1 << 16);
  const json spec = R"({"type":"scratch_linear","features":4,"workspace_bytes":64})"_json;
  const auto m = recorder->create("a", spec.dump(), spec.dump(), "default");
  recorder->setType(m, "hmc.nn.ScratchLinear");
  recorder->append(EventOp::kForward, m, Outcome::kOk, std::chrono::microseconds(3),
                   {{"device", "cpu"}, {"dtype", "float32"}, {"reused", false}});
  recorder->append(EventOp::kForward, m, Outcome::kOk, std::chrono::microseconds(1));
  if (hang) {
    recorder->append(EventOp::kClose, m, Outcome::kHang, std::chrono::seconds(5),
                     {{"kind", hangKind}, {"message", "'close validation' #1 timed out"}});
  } else {
    recorder->append(EventOp::kCloseAll, -1, Outcome::kOk, std::chrono::microseconds(9));
  }
  if (end) {
    recorder->end();
  } else {
    ::raise(SIGKILL);  // no end frame, no cut: the mapping's pages are the file's
  }
}

}  // namespace

TEST_CASE("a recording reads back as written, and ends") {
  TempDir dir;
  recordRank(dir.path, 0, false);
  const auto files = hmc::record::recordingFiles(dir.path);
  REQUIRE(files.size() == 1);
  const auto r = hmc::record::readRecording(files[0].second);
  CHECK(r.ended);
  CHECK(r.stop.empty());
  CHECK(r.header.rank == 0);
  CHECK(r.header.worldSize == 2);
  CHECK(r.header.timeoutS == 5.0);
  REQUIRE(r.events.size() == 4);
  CHECK(std::string(hmc::record::toString(r.events[0].op)) == "create");
  CHECK(r.events[0].detail["name"] == "a");
  CHECK(r.moduleTypes[0] == "hmc.nn.ScratchLinear");
  CHECK(r.events[1].detail["reused"] == false);
  CHECK(r.events[1].duration == std::chrono::microseconds(3));
  CHECK(r.events[2].detail.is_null());
  CHECK(std::string(hmc::record::toString(r.events[3].op)) == "close_all");
  // Cut to its frames at the end: plain events are 32 bytes.
  CHECK(readAll(files[0].second).size() < 1024);
}

TEST_CASE("a second creation of the same specification refers to the first") {
  TempDir dir;
  auto recorder = hmc::record::openRankRecording(dir.path, 0, 1, "p", 1.0);
  for (int i = 0; i < 100; ++i) recorder->create("", "{\"type\":\"x\"}", "k", "default");
  recorder->end();
  const auto r = hmc::record::readRecording(dir.path + "/rank-0.hmcrec");
  REQUIRE(r.events.size() == 100);
  CHECK(r.events[99].detail["spec"] == "{\"type\":\"x\"}");
  CHECK(r.moduleNames[99] == "m99");
  // Fixed 24 bytes + 8 of frame + a short reference, not the specification again.
  CHECK(recorder->bytesWritten() / 100 < 60);
}

TEST_CASE("a module's type is written once per specification and type, and read for each") {
  TempDir dir;
  auto recorder = hmc::record::openRankRecording(dir.path, 0, 1, "p", 1.0);
  const auto a0 = recorder->create("", "{\"type\":\"x\"}", "k", "default");
  recorder->setType(a0, "my.Block");
  const auto a1 = recorder->create("", "{\"type\":\"x\"}", "k", "default");
  const auto before = recorder->bytesWritten();
  recorder->setType(a1, "my.Block");
  CHECK(recorder->bytesWritten() == before);  // inferred: no frame
  CHECK(recorder->typeKnown(a1));
  const auto b = recorder->create("", "{\"type\":\"x\"}", "k", "default");
  recorder->setType(b, "my.OtherBlock");  // the same specification, another type: a frame
  CHECK(recorder->bytesWritten() > before);
  const auto a3 = recorder->create("", "{\"type\":\"x\"}", "k", "default");
  const auto same = recorder->bytesWritten();
  recorder->setType(a3, "my", "OtherBlock");  // in two parts: the same type, inferred
  CHECK(recorder->bytesWritten() == same);
  const auto c = recorder->create("", "{\"type\":\"y\"}", "k", "default");
  recorder->setType(c, "my.Block");  // another specification: a frame
  const auto a2 = recorder->create("", "{\"type\":\"x\"}", "k", "default");
  recorder->setType(a2, "my.OtherBlock");
  recorder->end();
  const auto r = hmc::record::readRecording(dir.path + "/rank-0.hmcrec");
  CHECK(r.moduleTypes == std::vector<std::string>{"my.Block", "my.Block", "my.OtherBlock",
                                                  "my.OtherBlock", "my.Block", "my.OtherBlock"});
}

TEST_CASE("modules created before their specification's first type frame get their own") {
  TempDir dir;
  auto recorder = hmc::record::openRankRecording(dir.path, 0, 1, "p", 1.0);
  // Both created, then typed: a reader gives each the type written for their specification
  // before its creation (none yet), so each needs its frame.
  const auto first = recorder->create("", "{\"type\":\"x\"}", "k", "default");
  const auto second = recorder->create("", "{\"type\":\"x\"}", "k", "default");
  recorder->setType(first, "my.Block");
  const auto before = recorder->bytesWritten();
  recorder->setType(second, "my.Block");
  CHECK(recorder->bytesWritten() > before);
  const auto third = recorder->create("", "{\"type\":\"x\"}", "k", "default");
  const auto after = recorder->bytesWritten();
  recorder->setType(third, "my.Block");  // created after the frame: inferred
  CHECK(recorder->bytesWritten() == after);
  recorder->end();
  const auto r = hmc::record::readRecording(dir.path + "/rank-0.hmcrec");
  CHECK(r.moduleTypes == std::vector<std::string>{"my.Block", "my.Block", "my.Block"});
}

TEST_CASE("a file left by a killed rank stops cleanly at its last finished call") {
  TempDir dir;
  recordRank(dir.path, 1, false, /*end=*/false);
  const auto r = hmc::record::readRecording(dir.path + "/rank-1.hmcrec");
  CHECK_FALSE(r.ended);
  CHECK(r.events.size() == 4);
  CHECK(r.stop.find("without its end record") != std::string::npos);
}

TEST_CASE("a torn or corrupted last frame keeps the events before it and says where") {
  TempDir dir;
  recordRank(dir.path, 0, false);
  const std::string path = dir.path + "/rank-0.hmcrec";
  const std::string whole = readAll(path);
  // Truncated in the middle of the end frame and of the close_all frame.
  writeAll(path, whole.substr(0, whole.size() - 40));
  auto r = hmc::record::readRecording(path);
  CHECK(r.events.size() == 3);
  CHECK(r.stop.find("byte") != std::string::npos);
  // A flipped byte in the last event's payload: its checksum fails.
  std::string flipped = whole;
  flipped[whole.size() - 32 - 3] ^= 0x40;
  writeAll(path, flipped);
  r = hmc::record::readRecording(path);
  CHECK(r.events.size() == 3);
  CHECK(r.stop.find("bad checksum at byte") != std::string::npos);
}

TEST_CASE("a foreign file is an error naming the file and the offset") {
  TempDir dir;
  const std::string path = dir.path + "/rank-0.hmcrec";
  writeAll(path, "{\"format\": \"hmc-report/1\"}");
  try {
    hmc::record::readRecording(path);
    FAIL("no error");
  } catch (const hmc::ValueError& error) {
    CHECK(std::string(error.what()).find(path + ": byte 0: not an hmc recording") == 0);
  }
  writeAll(path, "HMCREC01");
  CHECK_THROWS_WITH_AS(hmc::record::readRecording(path),
                       doctest::Contains("byte 8: no readable header"), hmc::ValueError);
}

TEST_CASE("at its cap a recording marks where it stopped and keeps the beginning") {
  TempDir dir;
  auto recorder = hmc::record::openRankRecording(dir.path, 0, 1, "p", 1.0, 4096);
  for (int i = 0; i < 1000; ++i) {
    recorder->append(EventOp::kBarrier, -1, Outcome::kOk, std::chrono::nanoseconds(i));
  }
  recorder->end();
  const auto r = hmc::record::readRecording(dir.path + "/rank-0.hmcrec");
  CHECK(r.capped);
  CHECK(r.events.size() > 100);
  CHECK(r.events.size() < 1000);
  CHECK(r.events[0].duration.count() == 0);  // the beginning is kept
  CHECK(r.stop.find("reached its cap of 4096 bytes") != std::string::npos);
}

TEST_CASE("the frames' checksum is zlib's CRC-32, eight bytes a step or one") {
  const std::string check = "123456789";  // the catalogue's check value
  CHECK(hmc::record::detail::crc32(reinterpret_cast<const unsigned char*>(check.data()),
                                   check.size()) == 0xCBF43926u);
  CHECK(hmc::record::detail::crc32(nullptr, 0) == 0u);
  // Against the bit-at-a-time definition, at every length up to 3 steps of 8 and their tails.
  const auto bitwise = [](const unsigned char* data, std::size_t bytes) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < bytes; ++i) {
      c ^= data[i];
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
  };
  std::mt19937 random(7);
  std::vector<unsigned char> bytes(40);
  for (auto& byte : bytes) byte = static_cast<unsigned char>(random());
  for (std::size_t n = 0; n <= bytes.size(); ++n) {
    CAPTURE(n);
    CHECK(hmc::record::detail::crc32(bytes.data(), n) == bitwise(bytes.data(), n));
  }
}

// Needs root (a mount namespace and a 2 MiB tmpfs); says so and passes without it.
TEST_CASE("a disk that fills up stops the recording with its reason, not a SIGBUS") {
  TempDir dir;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.path.c_str(), "tmpfs", 0, "size=2m") != 0) {
      ::_exit(77);
    }
    int code = 0;
    {
      auto recorder = hmc::record::openRankRecording(dir.path, 0, 1, "p", 1.0);
      for (int i = 0; i < 200000; ++i) {  // 6.4 MB of frames
        recorder->append(EventOp::kBarrier, -1, Outcome::kOk, std::chrono::nanoseconds(i));
      }
      recorder->end();
      const auto r = hmc::record::readRecording(dir.path + "/rank-0.hmcrec");
      if (!r.capped || r.events.size() < 10000 || r.events.size() >= 200000 ||
          r.stop.find("could not grow past") == std::string::npos ||
          r.stop.find("No space left on device") == std::string::npos) {
        std::fprintf(stderr, "capped %d, %zu events, stop: %s\n", r.capped ? 1 : 0, r.events.size(),
                     r.stop.c_str());
        code = 1;
      }
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    MESSAGE("not checked: no mount namespace with a small tmpfs here (needs root)");
    return;
  }
  CHECK_FALSE(WIFSIGNALED(status));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("merge: shared steps, a divergence carries ranks, a killed rank crashes there") {
  TempDir dir;
  recordRank(dir.path, 0, true);
  recordRank(dir.path, 1, false, /*end=*/false);
  const auto merged = hmc::record::mergeRecordings(dir.path, hmc::record::MergeExpect::kProgram);
  const json& steps = merged.scenario["steps"];
  CHECK(merged.scenario["world_size"] == 2);
  CHECK(merged.scenario["timeout_s"] == 5.0);
  REQUIRE(steps.size() == 6);
  CHECK(steps[0] == json{{"op", "create"},
                         {"module", "a"},
                         {"type", "scratch_linear"},
                         {"features", 4},
                         {"workspace_bytes", 64}});
  CHECK(steps[1] == json{{"op", "forward"}, {"module", "a"}});
  CHECK(steps[2] == json{{"op", "forward"}, {"module", "a"}});
  CHECK(steps[3] == json{{"op", "close"}, {"module", "a"}, {"ranks", {0}}});
  CHECK(steps[4] == json{{"op", "close_all"}, {"ranks", {1}}});
  CHECK(steps[5]["kind"] == "crash");
  CHECK(steps[5]["ranks"] == json{1});
  // Rank 0 timed out waiting: rank 1 was killed after the failure, and the crash is the
  // replay's own (it hangs as the run did).
  CHECK_FALSE(steps[5].contains("planned"));
  REQUIRE(merged.problems.size() == 1);
  CHECK(merged.problems[0].find("rank-1.hmcrec: the file ends after 4 events") !=
        std::string::npos);
  // observed: each step expects what it did.
  const auto observed = hmc::record::mergeRecordings(dir.path, hmc::record::MergeExpect::kObserved);
  CHECK(observed.scenario["steps"][3]["expect"] == "hang");
}

TEST_CASE("merge: a killed rank the others saw fail crashes unplanned, as the run counted it") {
  TempDir dir;
  recordRank(dir.path, 0, true, true, "rank_failure");
  recordRank(dir.path, 1, false, /*end=*/false);
  const auto merged = hmc::record::mergeRecordings(dir.path, hmc::record::MergeExpect::kProgram);
  const json& steps = merged.scenario["steps"];
  REQUIRE(steps.size() == 6);
  CHECK(steps[5]["kind"] == "crash");
  CHECK(steps[5]["planned"] == false);
  // The scenario reads back, and its outcome counts the crash as one it did not ask for.
  const auto scenario = hmc::scenario::parseScenario(merged.scenario, "merged.json");
  CHECK_FALSE(scenario.steps[5].crashPlanned);
}

TEST_CASE("merge: a rank stopped at work by its launcher stays at work; a marker it outlived goes") {
  // Rank 1's launcher stopped it outside any collective (hmc::World's marker at Open MPI's
  // warning), then SIGKILL: the replay keeps it at work where the others wait, not crashed.
  TempDir dir;
  recordRank(dir.path, 0, true);
  const auto stoppedRank = [&](bool goesOn) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      auto recorder = hmc::record::openRankRecording(dir.path, 1, 2, "prog", 5.0, 1 << 16);
      const json spec = R"({"type":"scratch_linear","features":4,"workspace_bytes":64})"_json;
      const auto m = recorder->create("a", spec.dump(), spec.dump(), "default");
      recorder->setType(m, "hmc.nn.ScratchLinear");
      recorder->append(EventOp::kForward, m, Outcome::kOk, std::chrono::microseconds(3),
                       {{"device", "cpu"}, {"dtype", "float32"}, {"reused", false}});
      recorder->append(EventOp::kSleep, -1, Outcome::kOk, std::chrono::nanoseconds(0),
                       {{"seconds", 11.0}, {"stopped_by", "mpirun's teardown"}});
      // A SIGCONT that was no teardown: the rank went on.
      if (goesOn) recorder->append(EventOp::kForward, m, Outcome::kOk, std::chrono::microseconds(1));
      ::raise(SIGKILL);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
  };
  stoppedRank(false);
  const json steps =
      hmc::record::mergeRecordings(dir.path, hmc::record::MergeExpect::kProgram).scenario["steps"];
  const json& last = steps.back();
  CHECK(last["op"] == "sleep");
  CHECK(last["seconds"] == 11.0);
  CHECK(last["ranks"] == json{1});
  CHECK(last["label"].get<std::string>().find("stopped by mpirun's teardown") != std::string::npos);
  for (const json& step : steps) CHECK(step.value("kind", "") != "crash");

  stoppedRank(true);
  const json again =
      hmc::record::mergeRecordings(dir.path, hmc::record::MergeExpect::kProgram).scenario["steps"];
  for (const json& step : again) CHECK(step.value("seconds", 0.0) != 11.0);
  CHECK(again.back()["kind"] == "crash");  // killed after it went on: where its file ends
}

TEST_CASE("merge: a missing rank file and a foreign one are named, the rest is merged") {
  TempDir dir;
  auto a = hmc::record::openRankRecording(dir.path, 0, 3, "p", 1.0);
  a->append(EventOp::kBarrier, -1, Outcome::kOk, std::chrono::nanoseconds(0));
  a->end();
  writeAll(dir.path + "/rank-1.hmcrec", "not a recording");
  const auto merged = hmc::record::mergeRecordings(dir.path, hmc::record::MergeExpect::kProgram);
  REQUIRE(merged.problems.size() == 2);
  CHECK(merged.problems[0].find("rank-1.hmcrec: byte 0: not an hmc recording") !=
        std::string::npos);
  CHECK(merged.problems[1].find("rank-2.hmcrec: missing (the world had 3 ranks)") !=
        std::string::npos);
  CHECK(merged.scenario["steps"] == json::array({{{"op", "barrier"}, {"ranks", {0}}}}));
}

namespace {

// A rank of `worldSize` that makes 40 cycles (create m, forward m, drop m: rows 0-119), then
// create a (120), two forwards of a (121, 122) and a barrier (123); at row 124 it closes a,
// with `closeError` when set; then rows 125-130. 131 rows in all, as in the run where a
// divergence at row 124 came after 124 identical rows.
std::shared_ptr<hmc::record::Recorder> recordCycles(const std::string& dir, int rank,
                                                    int worldSize) {
  auto recorder = hmc::record::openRankRecording(dir, rank, worldSize, "cycles", 5.0, 1 << 20);
  const json spec = R"({"type":"scratch_linear","features":4,"workspace_bytes":64})"_json;
  for (int cycle = 0; cycle < 40; ++cycle) {
    const auto m = recorder->create("m", spec.dump(), spec.dump(), "default");
    recorder->bound(m, std::chrono::microseconds(2), "cpu", "float32", cycle > 0);
    recorder->append(EventOp::kDrop, m, Outcome::kOk, std::chrono::microseconds(1));
  }
  const auto a = recorder->create("a", spec.dump(), spec.dump(), "default");
  recorder->bound(a, std::chrono::microseconds(2), "cpu", "float32", false);
  recorder->append(EventOp::kForward, a, Outcome::kOk, std::chrono::microseconds(1));
  recorder->append(EventOp::kBarrier, -1, Outcome::kOk, std::chrono::microseconds(1));
  return recorder;
}

void finishCycles(hmc::record::Recorder& recorder, bool closeError) {
  const std::int32_t a = 40;  // the module made after the 40 cycles' modules
  if (closeError) {
    recorder.append(EventOp::kClose, a, Outcome::kError, std::chrono::microseconds(5),
                    {{"kind", "runtime_error"},
                     {"message", "multicore resource manifests differ across ranks"}});
  } else {
    recorder.append(EventOp::kClose, a, Outcome::kOk, std::chrono::microseconds(5));
  }
  for (int i = 0; i < 5; ++i) {
    recorder.append(EventOp::kBarrier, -1, Outcome::kOk, std::chrono::microseconds(1));
  }
  recorder.append(EventOp::kCloseAll, -1, Outcome::kOk, std::chrono::microseconds(1));
  recorder.end();
}

std::vector<hmc::record::Recording> readAllRanks(const std::string& dir) {
  std::vector<hmc::record::Recording> out;
  for (const auto& [rank, path] : hmc::record::recordingFiles(dir)) {
    out.push_back(hmc::record::readRecording(path));
  }
  return out;
}

}  // namespace

TEST_CASE("show: the rows every rank repeats fold; the first divergence names its row and rank") {
  TempDir dir;
  for (int rank = 0; rank < 4; ++rank) {
    auto recorder = recordCycles(dir.path, rank, 4);
    finishCycles(*recorder, /*closeError=*/rank == 2);
  }
  const auto recordings = readAllRanks(dir.path);
  REQUIRE(recordings.size() == 4);
  hmc::record::ShowOptions options;
  options.directory = dir.path;
  const json shown = hmc::record::showDocument(recordings, options);
  CHECK(shown["format"] == "hmc-record-show/1");
  CHECK(shown["total_rows"] == 131);
  REQUIRE(shown["rows"].size() == 131);  // the JSON keeps every row
  CHECK(shown["rows"][124]["cells"][2] ==
        "close a: error (multicore resource manifests differ across ranks)");
  // Row 124, rank 2 alone: neither the row before nor another rank.
  CHECK(shown["divergence"] == 124);
  const json& first = shown["first_divergence"];
  CHECK(first["event"] == 124);
  CHECK(first["ranks"] == json{2});
  CHECK(first["agreeing_ranks"] == json{0, 1, 3});
  CHECK(first["usual"] == "close a");
  CHECK(first["summary"] ==
        "rank 2 has 'close a: error (multicore resource manifests differ across ranks)' where "
        "ranks 0, 1, 3 have 'close a'");
  CHECK(shown["first_failure"].is_null());  // rank 2's failed close is the divergence itself
  // Rows 0-120 fold (121 rows); 121-123 stay as the divergence's context.
  REQUIRE(shown["folds"].size() == 1);
  const json& fold = shown["folds"][0];
  CHECK(fold["first"] == 0);
  CHECK(fold["last"] == 124 - hmc::record::kFoldContextRows - 1);
  CHECK(fold["last"] == 120);
  CHECK(fold["events"] == 121);
  CHECK(fold["calls"] == json::parse(R"([{"op":"create","count":41},{"op":"forward","count":40},
                                         {"op":"drop","count":40}])"));
  CHECK(fold["summary"] ==
        "events 0-120: every rank the same (121 events: 41 create, 40 forward, 40 drop)");

  // --all: every row, nothing folded; the divergence is the same.
  options.fold = false;
  const json all = hmc::record::showDocument(recordings, options);
  CHECK(all["folds"].empty());
  CHECK(all["rows"].size() == 131);
  CHECK(all["divergence"] == 124);

  // --limit: the rows and the fold stop there, the divergence is still found beyond.
  options.fold = true;
  options.limit = 50;
  const json limited = hmc::record::showDocument(recordings, options);
  CHECK(limited["rows"].size() == 50);
  CHECK(limited["divergence"] == 124);
  REQUIRE(limited["folds"].size() == 1);
  CHECK(limited["folds"][0]["last"] == 49);
}

TEST_CASE("show: a rank whose file ends early differs there; a tie keeps rank 0's side") {
  TempDir dir;
  for (int rank = 0; rank < 4; ++rank) {
    auto recorder = recordCycles(dir.path, rank, 4);
    if (rank < 2) {
      finishCycles(*recorder, false);
    } else {
      recorder->end();  // ranks 2 and 3 stop after row 123
    }
  }
  const json shown = hmc::record::showDocument(readAllRanks(dir.path), {});
  CHECK(shown["divergence"] == 124);
  CHECK(shown["first_divergence"]["ranks"] == json{2, 3});
  CHECK(shown["first_divergence"]["agreeing_ranks"] == json{0, 1});
  CHECK(shown["first_divergence"]["summary"] ==
        "ranks 2, 3 have no event (their recordings end after 124 events) where ranks 0, 1 have "
        "'close a'");
  CHECK(shown["rows"][124]["cells"][3] == "");
  CHECK(shown["folds"][0]["last"] == 120);
}

TEST_CASE("show: a call every rank failed alike opens the table though no rank differs") {
  TempDir dir;
  for (int rank = 0; rank < 3; ++rank) {
    auto recorder = recordCycles(dir.path, rank, 3);
    finishCycles(*recorder, /*closeError=*/true);
  }
  const json shown = hmc::record::showDocument(readAllRanks(dir.path), {});
  CHECK(shown["divergence"].is_null());
  CHECK(shown["first_divergence"].is_null());
  CHECK(shown["first_failure"]["event"] == 124);
  CHECK(shown["first_failure"]["ranks"] == json{0, 1, 2});
  CHECK(shown["first_failure"]["summary"] ==
        "every rank has 'close a: error (multicore resource manifests differ across ranks)'");
  REQUIRE(shown["folds"].size() == 1);
  CHECK(shown["folds"][0]["last"] == 120);  // the failure is never folded away
}

TEST_CASE("show: ranks that agree throughout fold whole; short runs stay as they are") {
  TempDir dir;
  for (int rank = 0; rank < 2; ++rank) {
    auto recorder = recordCycles(dir.path, rank, 2);
    finishCycles(*recorder, false);
  }
  const json shown = hmc::record::showDocument(readAllRanks(dir.path), {});
  CHECK(shown["divergence"].is_null());
  CHECK(shown["first_failure"].is_null());
  REQUIRE(shown["folds"].size() == 1);
  CHECK(shown["folds"][0]["first"] == 0);
  CHECK(shown["folds"][0]["last"] == 130);
  // A divergence at row 3: rows 0-2 are its context, nothing folds.
  TempDir early;
  for (int rank = 0; rank < 2; ++rank) {
    auto recorder = hmc::record::openRankRecording(early.path, rank, 2, "p", 1.0);
    for (int i = 0; i < 3; ++i) {
      recorder->append(EventOp::kBarrier, -1, Outcome::kOk, std::chrono::microseconds(1));
    }
    recorder->append(rank == 0 ? EventOp::kBarrier : EventOp::kCloseAll, -1, Outcome::kOk,
                     std::chrono::microseconds(1));
    recorder->end();
  }
  const json small = hmc::record::showDocument(readAllRanks(early.path), {});
  CHECK(small["divergence"] == 3);
  CHECK(small["first_divergence"]["ranks"] == json{1});
  CHECK(small["first_divergence"]["summary"] ==
        "rank 1 has 'close_all' where rank 0 has 'barrier'");
  CHECK(small["folds"].empty());
}

TEST_CASE("show: rank lists read as ranges") {
  CHECK(hmc::record::rankRanges({0, 1, 2, 3, 5, 7, 8, 9}) == "0-3, 5, 7-9");
  CHECK(hmc::record::rankRanges({1, 0}) == "0, 1");
  CHECK(hmc::record::rankRanges({4}) == "4");
  CHECK(hmc::record::rankRanges({}).empty());
}
