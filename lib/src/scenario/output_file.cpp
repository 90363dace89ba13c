#include "hmc/scenario/output_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "hmc/error.hpp"

namespace hmc::scenario {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& reason) {
  throw RuntimeError(fmt::format("cannot write {}: {}", path, reason));
}

// Writes all of `text` to `fd`; false with errno set on failure.
bool writeAll(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// The folder a new file at `path` would be created in.
std::string folderOf(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

std::string checkOutputPath(const std::string& path) {
  if (path.empty()) return "cannot write an empty path: name a file, or - for standard output";
  if (path == "-") return "";
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return fmt::format("cannot write {}: it is a directory", path);
    if (!S_ISREG(info.st_mode)) {
      // A stream: it must open for writing now (a FIFO without a reader would block: refuse
      // only what access() says is not writable).
      if (::access(path.c_str(), W_OK) != 0) {
        return fmt::format("cannot write {}: {}", path, std::strerror(errno));
      }
      return "";
    }
  }
  const std::string folder = folderOf(path);
  struct stat folderInfo {};
  if (::stat(folder.c_str(), &folderInfo) != 0) {
    return fmt::format("cannot write {}: the folder {} does not exist ({})", path, folder,
                       std::strerror(errno));
  }
  if (!S_ISDIR(folderInfo.st_mode)) {
    return fmt::format("cannot write {}: {} is not a folder", path, folder);
  }
  // A temporary file is created there, then renamed: the folder must be writable.
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return fmt::format("cannot write {}: the folder {} is not writable ({})", path, folder,
                       std::strerror(errno));
  }
  return "";
}

void writeOutputFile(const std::string& path, const std::string& text) {
  if (path.empty()) fail(path, "empty path");
  if (path == "-") {
    std::fflush(stdout);
    if (!writeAll(STDOUT_FILENO, text)) fail("standard output", std::strerror(errno));
    return;
  }
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    if (S_ISDIR(info.st_mode)) fail(path, "it is a directory");
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(path, std::strerror(errno));
    const bool ok = writeAll(fd, text);
    const int saved = errno;
    ::close(fd);
    if (!ok) fail(path, std::strerror(saved));
    return;
  }
  // A symlink to a regular file (or to a new one) is written through: the link stays.
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    std::error_code ec;
    const fs::path target = fs::weakly_canonical(path, ec);
    if (!ec && target.string() != path) return writeOutputFile(target.string(), text);
  }
  std::string temporary =
      (fs::path(folderOf(path)) / ("." + fs::path(path).filename().string() + ".hmc-XXXXXX"))
          .string();
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0)
    fail(path, fmt::format("cannot create a temporary file in {}: {}", folderOf(path),
                           std::strerror(errno)));
  const mode_t mask = ::umask(0);  // mkstemp makes 0600; give the file what open() would
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  const bool ok = writeAll(fd, text);
  const int saved = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(temporary.c_str());
    fail(path, std::strerror(saved));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int renameError = errno;
    ::unlink(temporary.c_str());
    fail(path, std::strerror(renameError));
  }
}

}  // namespace hmc::scenario
