#pragma once
// A rank's recording of its resource lifecycle (HMC_RECORD=DIR, hmc::JoinOptions::record,
// `hmc-run --record DIR`): every lifecycle call made through hmc, in the order the rank made
// it, with its outcome and duration, in one file per rank (DIR/rank-<N>.hmcrec). `hmc-run
// record merge` turns the ranks' files into a scenario that replays the run on thread ranks;
// `hmc-run record show` prints them side by side.
//
// What is recorded: module creation (name, specification, compatibility key, scope), share,
// forward (the getExecutionResources call of a forward: device and dtype, and whether it
// bound the group by recycling or creating), a forward's backward kept pending and its later
// backward (hmc-run's runner; a program's own autograd is not seen), drop (the module's
// destructor), close, close_all (the manager's closeGroups over every group, the world's end
// included), the runtime release, and hmc-run's own steps that are not library calls (fault,
// barrier, sleep, check). Each with: ok, error (kind and message) or hang (the collective's
// stage), and its duration. Calls that bypass hmc (a program's own collectives, its own
// resources) are not recorded.
//
// The file, crash-consistent: an 8-byte magic "HMCREC01", then frames, each
//   u32 payload bytes | u32 CRC-32 of the payload | payload
// (little-endian). The first frame is the header (JSON: format "hmc-record/1", rank,
// world_size, host, pid, hmc version, start time, cap). The file is mapped and sized to its
// cap up front (sparse: it takes the disk its frames take, and the 256 KiB allocated ahead of
// them) and each frame is built in the mapping as its call ends, so the kernel holds every
// finished call at once: kill -9 loses at most the call in flight, and a reader stops at the
// first zero length, a torn frame or a bad CRC. A clean end writes an "end" frame and cuts the
// file to its frames. At the cap a "capped" frame marks where it stopped; the calls after it
// are not recorded (never a ring that drops the beginning). A disk that fills up stops it the
// same way, the frame then carrying the reason as text.
//
// Cost: an event is its fixed 24 bytes plus what only some carry: a creation's name and
// specification id (the specification's JSON only the first time it is seen), a binding's
// device and dtype (bytes, not JSON), an error's kind and message (JSON). No JSON is built or
// printed for a creation of a known specification, a binding, or a plain call. Thread safety:
// append is serialized by a lock; a rank's manager is used by
// one thread at a time anyway.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hmc::record {

// The kinds of events, as they appear in the file (one byte) and in `show` (the name).
enum class EventOp : std::uint8_t {
  kCreate = 1,
  kShare,
  kForward,
  kPending,  // the forward's output was kept: its backward is pending
  kBackward,
  kDrop,
  kClose,
  kCloseAll,
  kRelease,
  kFault,
  kBarrier,
  kSleep,
  kCheck,
  kEnd,     // a clean end
  kCapped,  // the file reached its cap: nothing after it was recorded
  kType,    // a module's concrete type (folded into the reader's moduleTypes, not an event)
};

enum class Outcome : std::uint8_t { kOk = 0, kError = 1, kHang = 2 };

std::string_view toString(EventOp op) noexcept;
std::string_view toString(Outcome outcome) noexcept;

// The default cap of a rank's file: 256 MiB, about 8 million plain events (a forward, a
// drop: 32 bytes each); a program with 10 modules at 10 steps a second (100 events/s) fills
// it in about 24 hours.
inline constexpr std::uint64_t kDefaultCapBytes = 256ull << 20;

struct RecordingHeader {
  int rank = 0;
  int worldSize = 1;
  std::string host;
  long pid = 0;
  std::string version;  // hmc's
  std::string name;     // the program's or scenario's name
  double startedUnix = 0;
  std::uint64_t capBytes = kDefaultCapBytes;
  double timeoutS = 30;  // the collectives' deadline

  nlohmann::json toJson() const;
  static RecordingHeader fromJson(const nlohmann::json& value);
};

// One recorded call. `module` is the rank's index of the module (its creation order, from 0;
// -1: none); `detail` what the event carries beyond that (see the writer's methods).
struct Event {
  EventOp op = EventOp::kCreate;
  Outcome outcome = Outcome::kOk;
  std::int32_t module = -1;
  std::chrono::nanoseconds duration{0};
  std::chrono::nanoseconds start{0};  // since the recording began
  nlohmann::json detail;              // null when the event carries nothing more
};

// Appends a rank's events to its file. Every method is noexcept: a recording that cannot
// write (disk full, cap) stops with a log line and never fails the program's call.
class Recorder {
 public:
  using Clock = std::chrono::steady_clock;

  // Creates (truncates) `path` and writes the header. Throws hmc::Error (RuntimeError) with
  // the path and the reason when the file cannot be created or mapped.
  Recorder(const std::string& path, RecordingHeader header);
  ~Recorder();  // end()
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  const std::string& path() const noexcept { return path_; }
  const RecordingHeader& header() const noexcept { return header_; }

  // A new module: returns its index. `name` (empty: "m<index>"), the specification,
  // compatibility key and scope as the module was constructed.
  std::int32_t create(std::string_view name, const nlohmann::json& specification,
                      const nlohmann::json& compatibilityKey, const nlohmann::json& scopeKey);
  // A forward that bound `module`'s group (recycled: `reused`) on `device` and `dtype`.
  // `ended`: when the bind ended, where the caller read the clock for its duration (saves a
  // read; default: now).
  void bound(std::int32_t module, std::chrono::nanoseconds duration, std::string_view device,
             std::string_view dtype, bool reused, Clock::time_point ended = {});
  // An event of `module` (or none: -1) with its outcome; `detail` may be null.
  void append(EventOp op, std::int32_t module, Outcome outcome, std::chrono::nanoseconds duration,
              const nlohmann::json& detail = nullptr);
  // The module's concrete type ("hmc.nn.ScratchLinear"), once: creation cannot know it (the
  // base class is constructed first), so the first event that can adds it. No frame when the
  // type last written for the module's specification, when it was created, is this one (a
  // reader infers it so).
  bool typeKnown(std::int32_t module) const noexcept;
  void setType(std::int32_t module, const std::string& type);
  // The same for the type `prefix` "." `name` ("hmc.nn" and "ScratchLinear"), built only when
  // a frame is written.
  void setType(std::int32_t module, std::string_view prefix, std::string_view name);
  // hmc-run's runner: what the step being run expects ("error", "hang", "any"; "" or "ok":
  // nothing), added to its events as "x" (and "xe": the expected error's text).
  void expect(std::string_view expect, const std::optional<std::string>& error);
  // Writes the end frame and cuts the file to its frames. Idempotent.
  void end() noexcept;
  std::uint64_t bytesWritten() const noexcept;
  std::uint64_t events() const noexcept;

 private:
  // How an event's extra bytes are encoded (the payload's third byte).
  static constexpr unsigned char kJson = 0;          // JSON text, or nothing
  static constexpr unsigned char kCreateBinary = 1;  // see create()
  static constexpr unsigned char kBindBinary = 2;    // see bound()
  struct Spec {
    nlohmann::json specification, compatibilityKey, scopeKey;
    std::int32_t type = -1;  // in types_: the type last written for one of its modules
  };

  // Allocates the file's blocks (fallocate) and maps its pages in (MADV_POPULATE_WRITE) up to
  // `end`, 256 KiB at a time: a frame then costs a copy, not a page fault, and a full disk
  // is an error here rather than a SIGBUS at a write into the mapping. Returns "" or why not.
  std::string reserve(std::uint64_t end);
  bool writeFrame(const void* payload, std::size_t bytes);
  // The frame whose `bytes` of payload are at used_ + 8 in the mapping: its CRC, then its
  // length; advances used_. Room for it was checked.
  void sealFrame(std::size_t bytes);
  // `ended`: when the call ended, if the caller read the clock already (else now).
  void writeEvent(EventOp op, Outcome outcome, std::int32_t module,
                  std::chrono::nanoseconds duration, std::string_view extra,
                  unsigned char encoding = kJson, Clock::time_point ended = {});
  // With the runner's expectation to carry (expect()): `detail` and the expectation, as JSON.
  // Under mutex_.
  void writeExpected(EventOp op, Outcome outcome, std::int32_t module,
                     std::chrono::nanoseconds duration, nlohmann::json detail);

  std::string path_;
  RecordingHeader header_;
  mutable std::mutex mutex_;
  int fd_ = -1;
  unsigned char* map_ = nullptr;
  std::uint64_t size_ = 0;  // mapped bytes (the cap)
  std::uint64_t used_ = 0;
  std::uint64_t ready_ = 0;  // bytes reserved (see reserve())
  std::uint64_t events_ = 0;
  bool stopped_ = false;  // capped, failed or ended
  std::int32_t modules_ = 0;
  std::vector<bool> typed_;
  std::vector<std::string> types_;         // the modules' types, each once
  std::vector<std::int32_t> inferred_;     // by module: its type as a reader infers it (-1: none)
  std::int32_t lastSpec_ = -1;             // the last module's specification
  std::vector<std::int32_t> moduleSpecs_;  // by module: its specification's id
  std::unordered_multimap<std::size_t, std::int32_t> specIds_;  // hash -> ids
  std::vector<Spec> specs_;
  std::string scratch_;
  Clock::time_point origin_ = Clock::now();
  std::string expect_;
  std::optional<std::string> expectError_;
};

namespace detail {
// The frames' checksum: CRC-32 as zlib computes it (crc32(0, data, bytes)).
std::uint32_t crc32(const unsigned char* data, std::size_t bytes) noexcept;
}  // namespace detail

// How a call that threw ended: hang for a collective's deadline or a lost rank (as a scenario
// step's status), error otherwise; and the detail an event carries for it: {"kind", "message"}.
Outcome outcomeOf(const std::exception& error) noexcept;
nlohmann::json errorDetail(const std::exception& error);

// Runs `fn` and records it as one event of `op` when `recorder` is set: its duration, its
// outcome and, when it throws, the error (then rethrown). `detail` is what the event carries
// besides. With no recorder it only calls `fn`.
template <class Fn>
void recordCall(Recorder* recorder, EventOp op, std::int32_t module, Fn&& fn,
                const nlohmann::json& detail = nullptr) {
  if (recorder == nullptr) {
    fn();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    fn();
  } catch (const std::exception& error) {
    nlohmann::json failed = errorDetail(error);
    if (detail.is_object()) failed.update(detail);
    recorder->append(op, module, outcomeOf(error), std::chrono::steady_clock::now() - start,
                     failed);
    throw;
  }
  recorder->append(op, module, Outcome::kOk, std::chrono::steady_clock::now() - start, detail);
}

// A rank's recording as read back.
struct Recording {
  std::string path;
  RecordingHeader header;
  std::vector<Event> events;  // the module's name, type and spec resolved into create's detail
  std::vector<std::string> moduleNames;  // by index
  std::vector<std::string> moduleTypes;  // by index ("" when never known)
  bool ended = false;                    // the program ended it cleanly
  bool capped = false;                   // it reached its cap
  // Why the events stop where they do when not ended: "" (ended), "the file ends after N events
  // without its end record: the rank was killed or is still running", "a torn frame at byte
  // N: ...".
  std::string stop;
};

// Reads a rank's file. Throws hmc::Error (ValueError) naming the file and the byte offset for
// a file that is not a recording (no magic, no readable header); a torn or truncated tail is
// not an error: the events before it are kept and `stop` says where and why.
Recording readRecording(const std::string& path);

// A rank's recording in `directory` (created when missing): DIR/rank-<rank>.hmcrec with its
// header (this host, pid and hmc version). Throws RuntimeError naming the path.
std::shared_ptr<Recorder> openRankRecording(const std::string& directory, int rank, int worldSize,
                                            const std::string& name, double timeoutS,
                                            std::uint64_t capBytes = kDefaultCapBytes);

// The files DIR/rank-<N>.hmcrec, by rank (sorted).
std::vector<std::pair<int, std::string>> recordingFiles(const std::string& directory);
std::string recordingFileName(int rank);

}  // namespace hmc::record
