#include "hmc/record/recording.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"
#include "hmc/log.hpp"

namespace hmc::record {
namespace {

constexpr char kMagic[8] = {'H', 'M', 'C', 'R', 'E', 'C', '0', '1'};
constexpr std::string_view kFormat = "hmc-record/1";
constexpr std::size_t kFrameHead = 8;  // u32 bytes + u32 CRC
// op, outcome, 2 spare, i32 module, u64 duration ns, u64 start ns (since the recording began)
constexpr std::size_t kEventFixed = 24;
// The longest reason a "capped" frame carries (why the recording stopped before its cap).
constexpr std::size_t kStopReasonBytes = 200;
// Room kept for the "capped" (with its reason) and "end" frames.
constexpr std::size_t kReserve = 2 * (kFrameHead + kEventFixed) + kStopReasonBytes;
// The file's blocks are allocated and its pages mapped in this far ahead of the frames (see
// Recorder::reserve).
// 256 KiB: with 1 MiB, the pages zeroed ahead had left the cache before the frames came (the
// recording's own work per reuse cycle 511 ns against 384 ns; 64 KiB 392 ns, 16 KiB 411 ns).
constexpr std::uint64_t kAhead = 256ull << 10;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels say EINVAL: faults map the pages
#endif

// CRC-32 (the polynomial of zlib and PNG, reflected), eight bytes a step ("slicing-by-8":
// table k holds the CRC of a byte followed by k zero bytes). A byte at a time it took about
// 150 ns of an event's 41 bytes, most of what recording a call cost.
using CrcTables = std::array<std::array<std::uint32_t, 256>, 8>;

const CrcTables& crcTables() {
  static const CrcTables tables = [] {
    CrcTables t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::size_t k = 1; k < t.size(); ++k) {
      for (std::uint32_t i = 0; i < 256; ++i) {
        t[k][i] = t[0][t[k - 1][i] & 0xFFu] ^ (t[k - 1][i] >> 8);
      }
    }
    return t;
  }();
  return tables;
}

}  // namespace

std::uint32_t detail::crc32(const unsigned char* data, std::size_t bytes) noexcept {
  const CrcTables& t = crcTables();
  std::uint32_t c = 0xFFFFFFFFu;
  for (; bytes >= 8; data += 8, bytes -= 8) {
    const std::uint32_t low =
        c ^ (static_cast<std::uint32_t>(data[0]) | static_cast<std::uint32_t>(data[1]) << 8 |
             static_cast<std::uint32_t>(data[2]) << 16 | static_cast<std::uint32_t>(data[3]) << 24);
    c = t[7][low & 0xFFu] ^ t[6][(low >> 8) & 0xFFu] ^ t[5][(low >> 16) & 0xFFu] ^ t[4][low >> 24] ^
        t[3][data[4]] ^ t[2][data[5]] ^ t[1][data[6]] ^ t[0][data[7]];
  }
  for (; bytes > 0; ++data, --bytes) c = t[0][(c ^ *data) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

namespace {

void putU32(unsigned char* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
void putU64(unsigned char* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint32_t getU32(const unsigned char* in) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | in[i];
  return v;
}
std::uint64_t getU64(const unsigned char* in) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | in[i];
  return v;
}

std::string systemError(int error) { return std::system_category().message(error); }

}  // namespace

std::string_view toString(EventOp op) noexcept {
  switch (op) {
    case EventOp::kCreate:
      return "create";
    case EventOp::kShare:
      return "share";
    case EventOp::kForward:
      return "forward";
    case EventOp::kPending:
      return "pending";
    case EventOp::kBackward:
      return "backward";
    case EventOp::kDrop:
      return "drop";
    case EventOp::kClose:
      return "close";
    case EventOp::kCloseAll:
      return "close_all";
    case EventOp::kRelease:
      return "release";
    case EventOp::kFault:
      return "fault";
    case EventOp::kBarrier:
      return "barrier";
    case EventOp::kSleep:
      return "sleep";
    case EventOp::kCheck:
      return "check";
    case EventOp::kEnd:
      return "end";
    case EventOp::kCapped:
      return "capped";
    case EventOp::kType:
      return "type";
  }
  return "unknown";
}

std::string_view toString(Outcome outcome) noexcept {
  switch (outcome) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kError:
      return "error";
    case Outcome::kHang:
      return "hang";
  }
  return "unknown";
}

nlohmann::json RecordingHeader::toJson() const {
  return {{"format", kFormat},
          {"rank", rank},
          {"world_size", worldSize},
          {"host", host},
          {"pid", pid},
          {"version", version},
          {"name", name},
          {"started_unix", startedUnix},
          {"cap_bytes", capBytes},
          {"timeout_s", timeoutS}};
}

RecordingHeader RecordingHeader::fromJson(const nlohmann::json& value) {
  if (!value.is_object() || value.value("format", "") != kFormat) {
    throw ValueError(fmt::format("its header is not {}", kFormat));
  }
  RecordingHeader h;
  h.rank = value.at("rank").get<int>();
  h.worldSize = value.at("world_size").get<int>();
  h.host = value.value("host", "");
  h.pid = value.value("pid", 0L);
  h.version = value.value("version", "");
  h.name = value.value("name", "");
  h.startedUnix = value.value("started_unix", 0.0);
  h.capBytes = value.value("cap_bytes", kDefaultCapBytes);
  h.timeoutS = value.value("timeout_s", 30.0);
  return h;
}

Outcome outcomeOf(const std::exception& error) noexcept {
  const ErrorKind kind = kindOf(error);
  return kind == ErrorKind::kTimeout || kind == ErrorKind::kRankFailure ? Outcome::kHang
                                                                        : Outcome::kError;
}

nlohmann::json errorDetail(const std::exception& error) {
  std::string message = error.what();
  message = message.substr(0, message.find('\n'));  // c10::Error: its backtrace follows
  return {{"kind", toString(kindOf(error))}, {"message", std::move(message)}};
}

std::string recordingFileName(int rank) { return fmt::format("rank-{}.hmcrec", rank); }

Recorder::Recorder(const std::string& path, RecordingHeader header)
    : path_(path), header_(std::move(header)) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw RuntimeError(
        fmt::format("cannot create the recording {}: {}; check that its folder "
                    "exists and is writable",
                    path, systemError(errno)));
  }
  size_ = std::max<std::uint64_t>(header_.capBytes, 4096);
  if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
    const int error = errno;
    ::close(fd_);
    throw RuntimeError(fmt::format("cannot size the recording {} to its cap of {} bytes: {}", path,
                                   size_, systemError(error)));
  }
  void* map = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) {
    const int error = errno;
    ::close(fd_);
    throw RuntimeError(fmt::format("cannot map the recording {}: {}", path, systemError(error)));
  }
  map_ = static_cast<unsigned char*>(map);
  used_ = sizeof(kMagic);
  const std::string head = header_.toJson().dump();
  if (const std::string why = reserve(used_ + kFrameHead + head.size() + kReserve); !why.empty()) {
    ::munmap(map_, size_);
    map_ = nullptr;
    ::close(fd_);
    fd_ = -1;
    throw RuntimeError(
        fmt::format("cannot allocate the recording {}: {}; free space there, or "
                    "point HMC_RECORD elsewhere",
                    path, why));
  }
  std::memcpy(map_, kMagic, sizeof(kMagic));  // reserved: no fault, no SIGBUS on a full disk
  if (!writeFrame(head.data(), head.size())) {
    end();
    throw RuntimeError(
        fmt::format("the recording {}: its cap of {} bytes cannot hold its header", path, size_));
  }
}

Recorder::~Recorder() { end(); }

std::string Recorder::reserve(std::uint64_t end) {
  if (end <= ready_) return {};
  const std::uint64_t target = std::min(size_, (end + kAhead - 1) / kAhead * kAhead);
  const auto offset = static_cast<off_t>(ready_);
  const auto length = static_cast<off_t>(target - ready_);
  int result = 0;
  do {
    result = ::fallocate(fd_, 0, offset, length);
  } while (result != 0 && errno == EINTR);
  // A filesystem without fallocate: the pages are allocated as they are written (a full disk
  // is then a SIGBUS, as with any write into a mapping).
  if (result != 0 && errno != EOPNOTSUPP && errno != ENOSYS) return systemError(errno);
  // ready_ is a multiple of kAhead (or the cap, past which nothing is reserved): page-aligned.
  (void)::madvise(map_ + ready_, static_cast<std::size_t>(length), MADV_POPULATE_WRITE);
  ready_ = target;
  return {};
}

bool Recorder::writeFrame(const void* payload, std::size_t bytes) {
  if (used_ + kFrameHead + bytes > size_) return false;
  std::memcpy(map_ + used_ + kFrameHead, payload, bytes);
  sealFrame(bytes);
  return true;
}

void Recorder::sealFrame(std::size_t bytes) {
  unsigned char* at = map_ + used_;
  putU32(at + 4, detail::crc32(at + kFrameHead, bytes));
  // The length last: a reader that sees it sees the rest (the same mapping, program order; a
  // kill between the two leaves a zero length, where a reader stops).
  putU32(at, static_cast<std::uint32_t>(bytes));
  used_ += kFrameHead + bytes;
}

void Recorder::writeEvent(EventOp op, Outcome outcome, std::int32_t module,
                          std::chrono::nanoseconds duration, std::string_view extra,
                          unsigned char encoding, Clock::time_point ended) {
  if (stopped_) return;
  const std::size_t bytes = kEventFixed + extra.size();
  const bool fits = used_ + kFrameHead + bytes + kReserve <= size_;
  const bool marker = op == EventOp::kEnd || op == EventOp::kCapped;
  if (!fits && !marker) {
    writeEvent(EventOp::kCapped, Outcome::kOk, -1, std::chrono::nanoseconds(0), {});
    stopped_ = true;
    logger()->warn(
        "the recording {} reached its cap of {} bytes after {} events: the calls "
        "after it are not recorded (raise HMC_RECORD_CAP)",
        path_, size_, events_);
    return;
  }
  if (!marker) {
    // The room kept for the markers is always reserved, so a marker never needs this.
    if (std::string why = reserve(used_ + kFrameHead + bytes + kReserve); !why.empty()) {
      why = fmt::format("the file could not grow past {} bytes: {}", used_, why);
      why.resize(std::min(why.size(), kStopReasonBytes));
      writeEvent(EventOp::kCapped, Outcome::kOk, -1, std::chrono::nanoseconds(0), why);
      stopped_ = true;
      logger()->warn(
          "the recording {} stopped after {} events: {}: the calls after it are not recorded "
          "(free space where HMC_RECORD points)",
          path_, events_, why);
      return;
    }
  }
  if (used_ + kFrameHead + bytes > size_) return;  // a marker always fits (kReserve)
  // Built in place, in the mapping: the length written last (sealFrame).
  unsigned char* payload = map_ + used_ + kFrameHead;
  payload[0] = static_cast<unsigned char>(op);
  payload[1] = static_cast<unsigned char>(outcome);
  payload[2] = encoding;
  payload[3] = 0;
  putU32(payload + 4, static_cast<std::uint32_t>(module));
  putU64(payload + 8, static_cast<std::uint64_t>(duration.count()));
  if (ended == Clock::time_point{}) ended = Clock::now();
  const auto start = ended - duration - origin_;
  putU64(payload + 16,
         static_cast<std::uint64_t>(std::max<std::int64_t>(
             0, std::chrono::duration_cast<std::chrono::nanoseconds>(start).count())));
  if (!extra.empty()) std::memcpy(payload + kEventFixed, extra.data(), extra.size());
  sealFrame(bytes);
  ++events_;
}

std::int32_t Recorder::create(std::string_view name, const nlohmann::json& specification,
                              const nlohmann::json& compatibilityKey,
                              const nlohmann::json& scopeKey) {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::int32_t index = modules_++;
    typed_.push_back(false);
    moduleSpecs_.push_back(-1);
    inferred_.push_back(-1);
    // The specification's id: the last one created again (the common case, a model rebuilt
    // every step: one comparison), else a hash of the three values, then equality. No text is
    // printed for a specification seen before.
    const auto same = [&](const Spec& known) {
      return known.specification == specification && known.compatibilityKey == compatibilityKey &&
             known.scopeKey == scopeKey;
    };
    std::int32_t id = -1;
    if (lastSpec_ >= 0 && same(specs_[static_cast<std::size_t>(lastSpec_)])) id = lastSpec_;
    std::size_t hash = 0;
    if (id < 0) {
      hash = std::hash<nlohmann::json>{}(specification);
      hash = hash * 31 + std::hash<nlohmann::json>{}(compatibilityKey);
      hash = hash * 31 + std::hash<nlohmann::json>{}(scopeKey);
      const auto [first, last] = specIds_.equal_range(hash);
      for (auto it = first; it != last && id < 0; ++it) {
        if (same(specs_[static_cast<std::size_t>(it->second)])) id = it->second;
      }
    }
    std::string definition;
    if (id < 0) {
      id = static_cast<std::int32_t>(specs_.size());
      specs_.push_back(Spec{specification, compatibilityKey, scopeKey});
      specIds_.emplace(hash, id);
      definition =
          nlohmann::json{{"spec", specification}, {"compat", compatibilityKey}, {"scope", scopeKey}}
              .dump();
    }
    // Binary: u32 specification id, u16 name bytes, the name, the definition's JSON (only the
    // first time).
    const std::size_t nameBytes = std::min<std::size_t>(name.size(), 0xFFFF);
    scratch_.resize(6 + nameBytes + definition.size());
    auto* out = reinterpret_cast<unsigned char*>(scratch_.data());
    putU32(out, static_cast<std::uint32_t>(id));
    out[4] = static_cast<unsigned char>(nameBytes & 0xFF);
    out[5] = static_cast<unsigned char>(nameBytes >> 8);
    std::memcpy(out + 6, name.data(), nameBytes);
    std::memcpy(out + 6 + nameBytes, definition.data(), definition.size());
    moduleSpecs_.back() = id;
    lastSpec_ = id;
    inferred_.back() = specs_[static_cast<std::size_t>(id)].type;
    writeEvent(EventOp::kCreate, Outcome::kOk, index, std::chrono::nanoseconds(0), scratch_,
               kCreateBinary);
    return index;
  } catch (const std::exception& error) {
    logger()->warn("the recording {}: cannot record a creation: {}", path_, error.what());
    return -1;
  }
}

void Recorder::bound(std::int32_t module, std::chrono::nanoseconds duration,
                     std::string_view device, std::string_view dtype, bool reused,
                     Clock::time_point ended) {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!expect_.empty()) {  // hmc-run's runner with an expectation to carry: the JSON form
      writeExpected(EventOp::kForward, Outcome::kOk, module, duration,
                    {{"device", device}, {"dtype", dtype}, {"reused", reused}});
      return;
    }
    // Binary: u8 reused, the device, a 0 byte, the dtype.
    scratch_.clear();
    scratch_ += reused ? '\x01' : '\x00';
    scratch_ += device;
    scratch_ += '\0';
    scratch_ += dtype;
    writeEvent(EventOp::kForward, Outcome::kOk, module, duration, scratch_, kBindBinary, ended);
  } catch (const std::exception& error) {
    logger()->warn("the recording {}: cannot record a binding: {}", path_, error.what());
  }
}

void Recorder::writeExpected(EventOp op, Outcome outcome, std::int32_t module,
                             std::chrono::nanoseconds duration, nlohmann::json detail) {
  if (!detail.is_object()) detail = nlohmann::json::object();
  detail["x"] = expect_;
  if (expectError_) detail["xe"] = *expectError_;
  writeEvent(op, outcome, module, duration, detail.dump());
}

void Recorder::expect(std::string_view expect, const std::optional<std::string>& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  expect_ = expect == "ok" ? std::string() : std::string(expect);
  expectError_ = error;
}

void Recorder::append(EventOp op, std::int32_t module, Outcome outcome,
                      std::chrono::nanoseconds duration, const nlohmann::json& detail) {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!expect_.empty()) {
      writeExpected(op, outcome, module, duration, detail);
    } else if (detail.is_null()) {
      writeEvent(op, outcome, module, duration, {});
    } else {
      writeEvent(op, outcome, module, duration, detail.dump());
    }
  } catch (const std::exception& error) {
    logger()->warn("the recording {}: cannot record a {}: {}", path_, toString(op), error.what());
  }
}

bool Recorder::typeKnown(std::int32_t module) const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return module < 0 || static_cast<std::size_t>(module) >= typed_.size() ||
         typed_[static_cast<std::size_t>(module)];
}

void Recorder::setType(std::int32_t module, const std::string& type) { setType(module, type, {}); }

void Recorder::setType(std::int32_t module, std::string_view prefix, std::string_view name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (module < 0 || static_cast<std::size_t>(module) >= typed_.size()) return;
  const auto index = static_cast<std::size_t>(module);
  typed_[index] = true;
  const std::size_t length = prefix.size() + (name.empty() ? 0 : 1 + name.size());
  const auto isType = [&](const std::string& known) {  // known == prefix "." name, unbuilt
    return known.size() == length && known.compare(0, prefix.size(), prefix) == 0 &&
           (name.empty() || (known[prefix.size()] == '.' &&
                             known.compare(prefix.size() + 1, name.size(), name) == 0));
  };
  // A reader gives a module, at its creation, the type last written for its specification: no
  // frame when that is this type (the common case, a model rebuilt every step).
  if (const std::int32_t inferred = inferred_[index];
      inferred >= 0 && isType(types_[static_cast<std::size_t>(inferred)])) {
    return;
  }
  std::string type(prefix);
  if (!name.empty()) type.append(".").append(name);
  if (const std::int32_t spec = moduleSpecs_[index]; spec >= 0) {
    auto known = std::find(types_.begin(), types_.end(), type);
    if (known == types_.end()) known = types_.insert(types_.end(), type);
    specs_[static_cast<std::size_t>(spec)].type = static_cast<std::int32_t>(known - types_.begin());
  }
  // Its start is not read (not an event): no clock.
  writeEvent(EventOp::kType, Outcome::kOk, module, std::chrono::nanoseconds(0), type, kJson,
             origin_);
}

void Recorder::end() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (map_ == nullptr) return;
  if (!stopped_) writeEvent(EventOp::kEnd, Outcome::kOk, -1, std::chrono::nanoseconds(0), {});
  stopped_ = true;
  ::munmap(map_, size_);
  map_ = nullptr;
  if (::ftruncate(fd_, static_cast<off_t>(used_)) != 0) {
    logger()->warn("the recording {}: cannot cut it to its {} bytes: {}", path_, used_,
                   systemError(errno));
  }
  ::close(fd_);
  fd_ = -1;
}

std::uint64_t Recorder::bytesWritten() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

std::uint64_t Recorder::events() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

namespace {

// A recording's frames, one at a time, never the whole file: a live or killed rank's file has
// the size of its cap (256 MiB by default, zeros after the last frame); reading it whole took
// about 7 s a file.
class FrameReader {
 public:
  // Opens `path` and reads past its magic. Throws ValueError naming the file.
  explicit FrameReader(const std::string& path) : in_(path, std::ios::binary) {
    if (!in_) {
      throw ValueError(fmt::format("{}: cannot open it: {}", path, systemError(errno)));
    }
    std::error_code sizeError;
    size_ = std::filesystem::file_size(path, sizeError);
    if (sizeError) {
      throw ValueError(fmt::format("{}: cannot read its size: {}", path, sizeError.message()));
    }
    unsigned char magic[sizeof(kMagic)] = {};
    in_.read(reinterpret_cast<char*>(magic), sizeof(magic));
    if (in_.gcount() != static_cast<std::streamsize>(sizeof(kMagic)) ||
        std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
      throw ValueError(fmt::format(
          "{}: byte 0: not an hmc recording (it does not begin with \"HMCREC01\"); pass the "
          "folder HMC_RECORD or --record wrote",
          path));
    }
  }

  // Where the next frame begins.
  std::uintmax_t at() const noexcept { return at_; }

  // The frame at at(): "ok" with its payload (valid until the next call), "" at the end of the
  // frames, or why there is none.
  std::string next(std::string_view& payload) {
    if (at_ + kFrameHead > size_) {
      return at_ == size_ ? "" : fmt::format("a frame cut short at byte {}", at_);
    }
    unsigned char head[kFrameHead];
    in_.read(reinterpret_cast<char*>(head), kFrameHead);
    if (in_.gcount() != static_cast<std::streamsize>(kFrameHead)) {
      return fmt::format("a frame cut short at byte {}", at_);
    }
    const std::uint32_t length = getU32(head);
    if (length == 0) return "";
    if (at_ + kFrameHead + length > size_) {
      return fmt::format("a torn frame at byte {} ({} bytes announced, {} there)", at_, length,
                         size_ - at_ - kFrameHead);
    }
    buffer_.resize(length);
    in_.read(buffer_.data(), length);
    if (in_.gcount() != static_cast<std::streamsize>(length)) {
      return fmt::format("a torn frame at byte {} ({} bytes announced, {} there)", at_, length,
                         in_.gcount());
    }
    if (detail::crc32(reinterpret_cast<const unsigned char*>(buffer_.data()), length) !=
        getU32(head + 4)) {
      return fmt::format("a frame with a bad checksum at byte {}", at_);
    }
    payload = std::string_view(buffer_.data(), length);
    at_ += kFrameHead + length;
    return "ok";
  }

 private:
  std::ifstream in_;
  std::uintmax_t size_ = 0;
  std::uintmax_t at_ = sizeof(kMagic);
  std::string buffer_;  // the current frame's payload
};

// The first frame: the header. Throws ValueError naming the file and the byte.
RecordingHeader readHeader(FrameReader& reader, const std::string& path) {
  std::string_view payload;
  const std::string state = reader.next(payload);
  if (state != "ok") {
    throw ValueError(fmt::format("{}: byte {}: no readable header ({})", path, sizeof(kMagic),
                                 state.empty() ? "the file ends there" : state));
  }
  try {
    return RecordingHeader::fromJson(nlohmann::json::parse(payload));
  } catch (const std::exception& error) {
    throw ValueError(fmt::format("{}: byte {}: the header cannot be read: {}", path,
                                 sizeof(kMagic) + kFrameHead, error.what()));
  }
}

// What creations and type frames said so far, for the modules created after them.
struct Specifications {
  std::vector<nlohmann::json> specs;     // by spec id: {"spec","compat","scope"}
  std::vector<std::string> specTypes;    // by spec id: the type its modules were last given
  std::vector<std::size_t> moduleSpecs;  // by module: its spec id
};

// An event's detail from the bytes after its fixed part, in its frame's encoding. Throws.
nlohmann::json decodeDetail(unsigned char encoding, std::string_view extra) {
  if (encoding == 2) {  // a binding: u8 reused, device, 0, dtype
    if (extra.empty()) throw ValueError("an empty binding");
    const std::string_view rest = extra.substr(1);
    const std::size_t zero = rest.find('\0');
    if (zero == std::string_view::npos) throw ValueError("a binding without its dtype");
    return {{"device", std::string(rest.substr(0, zero))},
            {"dtype", std::string(rest.substr(zero + 1))},
            {"reused", extra[0] != 0}};
  }
  if (encoding == 1) {  // a creation: u32 spec id, u16 name bytes, name, definition
    if (extra.size() < 6) throw ValueError("a creation cut short");
    const auto* b = reinterpret_cast<const unsigned char*>(extra.data());
    const std::size_t nameBytes = b[4] | (static_cast<std::size_t>(b[5]) << 8);
    if (extra.size() < 6 + nameBytes) throw ValueError("a creation's name cut short");
    nlohmann::json detail = {{"s", getU32(b)}};
    if (nameBytes > 0) detail["n"] = std::string(extra.substr(6, nameBytes));
    if (extra.size() > 6 + nameBytes) {
      detail.update(nlohmann::json::parse(extra.substr(6 + nameBytes)));
    }
    return detail;
  }
  if (encoding == 0) {
    return extra.empty() ? nlohmann::json() : nlohmann::json::parse(extra);
  }
  throw ValueError(fmt::format("unknown encoding {} (a newer hmc wrote it?)", encoding));
}

// A creation's detail made whole (its specification, its name) and its module entered in
// `out` with the type last written for its specification (the writer leaves a module's type
// frame out only then). Throws ValueError when the ids are out of order or unknown.
void enterCreation(Event& event, Recording& out, Specifications& known) {
  const auto id = event.detail.at("s").get<std::size_t>();
  if (event.detail.contains("spec")) {
    if (id != known.specs.size()) throw ValueError("specification ids out of order");
    known.specs.push_back({{"spec", event.detail["spec"]},
                           {"compat", event.detail["compat"]},
                           {"scope", event.detail["scope"]}});
  }
  if (id >= known.specs.size()) throw ValueError(fmt::format("unknown specification {}", id));
  const std::string name = event.detail.value("n", fmt::format("m{}", out.moduleNames.size()));
  event.detail = known.specs[id];
  event.detail["name"] = name;
  if (event.module != static_cast<std::int32_t>(out.moduleNames.size())) {
    throw ValueError(fmt::format("module {} created out of order", event.module));
  }
  out.moduleNames.push_back(name);
  known.specTypes.resize(known.specs.size());
  out.moduleTypes.push_back(known.specTypes[id]);
  known.moduleSpecs.push_back(id);
}

// One event frame (at byte `frameAt`) into `out`: an event appended, a module's type noted,
// or the end or cap marked. False when reading stops there (out.stop says why, except at an
// end record).
bool readEvent(std::string_view payload, std::size_t frameAt, Recording& out,
               Specifications& known) {
  if (payload.size() < kEventFixed) {
    out.stop = fmt::format("a frame of {} bytes at byte {}, too short for an event", payload.size(),
                           frameAt);
    return false;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(payload.data());
  if (p[0] < 1 || p[0] > static_cast<unsigned char>(EventOp::kType) || p[1] > 2) {
    out.stop = fmt::format("an event of unknown kind {} at byte {} (a newer hmc wrote it?)",
                           static_cast<int>(p[0]), frameAt);
    return false;
  }
  Event event;
  event.op = static_cast<EventOp>(p[0]);
  event.outcome = static_cast<Outcome>(p[1]);
  event.module = static_cast<std::int32_t>(getU32(p + 4));
  event.duration = std::chrono::nanoseconds(static_cast<std::int64_t>(getU64(p + 8)));
  event.start = std::chrono::nanoseconds(static_cast<std::int64_t>(getU64(p + 16)));
  const std::string_view extra = payload.substr(kEventFixed);
  switch (event.op) {
    case EventOp::kType:
      if (event.module >= 0 && static_cast<std::size_t>(event.module) < out.moduleTypes.size()) {
        const auto module = static_cast<std::size_t>(event.module);
        out.moduleTypes[module] = std::string(extra);
        known.specTypes[known.moduleSpecs[module]] = std::string(extra);
      }
      return true;
    case EventOp::kEnd:
      out.ended = true;
      return false;
    case EventOp::kCapped:
      out.capped = true;
      // A reason: it stopped before its cap (the disk was full).
      out.stop = extra.empty()
                     ? fmt::format("it reached its cap of {} bytes after {} events",
                                   out.header.capBytes, out.events.size())
                     : fmt::format("it stopped after {} events: {}", out.events.size(), extra);
      return false;
    default:
      break;
  }
  try {
    event.detail = decodeDetail(p[2], extra);
    if (event.op == EventOp::kCreate) enterCreation(event, out, known);
  } catch (const std::exception& error) {
    out.stop = fmt::format("an event at byte {} cannot be read: {}", frameAt, error.what());
    return false;
  }
  if (event.module >= static_cast<std::int32_t>(out.moduleNames.size())) {
    out.stop =
        fmt::format("an event at byte {} names module {}, never created", frameAt, event.module);
    return false;
  }
  out.events.push_back(std::move(event));
  return true;
}

}  // namespace

Recording readRecording(const std::string& path) {
  FrameReader reader(path);
  Recording out;
  out.path = path;
  out.header = readHeader(reader, path);
  Specifications known;
  for (;;) {
    const std::size_t frameAt = reader.at();
    std::string_view payload;
    const std::string state = reader.next(payload);
    if (state != "ok") {
      out.stop = state.empty()
                     ? fmt::format(
                           "the file ends after {} events without its end record: the rank was "
                           "killed, or is still running",
                           out.events.size())
                     : fmt::format("{} after {} events: the rank was killed while writing it",
                                   state, out.events.size());
      break;
    }
    if (!readEvent(payload, frameAt, out, known)) break;
  }
  return out;
}

std::shared_ptr<Recorder> openRankRecording(const std::string& directory, int rank, int worldSize,
                                            const std::string& name, double timeoutS,
                                            std::uint64_t capBytes) {
  if (::mkdir(directory.c_str(), 0755) != 0 && errno != EEXIST) {
    throw RuntimeError(
        fmt::format("cannot create the recording folder {}: {}", directory, systemError(errno)));
  }
  RecordingHeader header;
  header.rank = rank;
  header.worldSize = worldSize;
  header.host = hostName();
  header.pid = static_cast<long>(::getpid());
  header.version = HMC_VERSION;
  header.name = name;
  header.startedUnix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  header.capBytes = capBytes;
  header.timeoutS = timeoutS;
  return std::make_shared<Recorder>(directory + "/" + recordingFileName(rank), std::move(header));
}

std::vector<std::pair<int, std::string>> recordingFiles(const std::string& directory) {
  std::vector<std::pair<int, std::string>> out;
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) {
    throw ValueError(
        fmt::format("cannot read the recording folder {}: {}", directory, systemError(errno)));
  }
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    int rank = -1;
    char tail = 0;
    if (std::sscanf(name.c_str(), "rank-%d.hmcre%c", &rank, &tail) == 2 && tail == 'c' &&
        name == recordingFileName(rank)) {
      out.emplace_back(rank, directory + "/" + name);
    }
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace hmc::record
