#include "atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "check.hpp"

namespace ringzero {
namespace {

// The directory `path` lives in ("." for a bare file name).
std::string directory_of(const std::string& path) {
  const std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

// A new, empty, exclusive temporary file "<path>.tmp.XXXXXX" next to `path`: returns its fd
// and sets `tmp` to its name, or -1 with errno set.
int make_temp_next_to(const std::string& path, std::string& tmp) {
  std::vector<char> name(path.begin(), path.end());
  for (char c : std::string_view(".tmp.XXXXXX")) name.push_back(c);
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  tmp = name.data();
  return fd;
}

}  // namespace

void ignore_file_size_signal() {
  std::signal(SIGXFSZ, SIG_IGN);
}

void write_file_atomically(const std::string& path, std::string_view bytes,
                           const AtomicWriteOptions& options) {
  RZ_CHECK(!path.empty(), "write_file_atomically: empty path");
  ignore_file_size_signal();
  std::string tmp;
  const int fd = make_temp_next_to(path, tmp);
  RZ_CHECK(fd >= 0, "cannot write " << path << ": " << std::strerror(errno)
                                    << "; check the directory " << directory_of(path)
                                    << " exists and is writable" << options.advice);
  size_t done = 0;
  auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    RZ_CHECK(false, "writing " << path << " failed after " << done << " of " << bytes.size()
                               << " bytes (" << what << ": " << reason
                               << " (disk full or file size limit?)); the previous file, if any, "
                                  "is intact"
                               << options.advice);
  };
  while (done < bytes.size()) {
    if (options.kill_halfway && done >= bytes.size() / 2) std::raise(SIGKILL);
    const size_t chunk =
        std::min<size_t>(bytes.size() - done, options.kill_halfway ? 4096 : 1 << 24);
    const ssize_t n = ::write(fd, bytes.data() + done, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = ENOSPC;
    if (n <= 0) fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync");
  // mkstemp creates 0600; an output file gets the usual 0666 & ~umask.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) fail("fchmod");
  if (::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    RZ_CHECK(false, "writing " << path << " failed (close: " << reason << ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    RZ_CHECK(false, "cannot replace " << path << ": " << reason
                                      << "; is it a directory, or on a read-only file system?");
  }
  // The rename is durable only once the directory entry is: fsync the directory too.
  const int dir = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);  // best effort: some file systems refuse fsync on a directory
    ::close(dir);
  }
}

RecordFile::RecordFile(const std::string& path, std::string flag, bool truncate)
    : path_(path), flag_(std::move(flag)) {
  ignore_file_size_signal();
  const mode_t mask = ::umask(0);
  ::umask(mask);
  fd_ =
      ::open(path.c_str(), O_WRONLY | O_CREAT | (truncate ? O_TRUNC : 0) | O_CLOEXEC, 0666 & ~mask);
  RZ_CHECK(fd_ >= 0, "cannot write " << flag_ << " " << path << ": " << std::strerror(errno)
                                     << "; give a file path in an existing, writable directory");
  size_ = ::lseek(fd_, 0, SEEK_END);  // appending: a failed write is cut back to here
  RZ_CHECK(size_ >= 0, "cannot seek in " << flag_ << " " << path << ": " << std::strerror(errno));
}

RecordFile::~RecordFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RecordFile::append(std::string_view record) {
  if (fd_ < 0) return;
  size_t done = 0;
  while (done < record.size()) {  // one write(2) unless interrupted or short
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason = std::strerror(n == 0 ? ENOSPC : errno);
      const bool cut = ::ftruncate(fd_, size_) == 0 && ::lseek(fd_, size_, SEEK_SET) == size_;
      ::close(fd_);
      fd_ = -1;
      RZ_CHECK(false, "writing " << flag_ << " " << path_ << " failed at record " << records_ + 1
                                 << " (" << reason << " (disk full or file size limit?)); "
                                 << (cut ? "the file keeps the " + std::to_string(records_) +
                                               " whole records before it"
                                         : "the last record may be cut")
                                 << ". Free space, or point " << flag_ << " elsewhere");
    }
    done += static_cast<size_t>(n);
  }
  size_ += static_cast<int64_t>(record.size());
  ++records_;
}

void check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  RZ_CHECK(!std::filesystem::is_directory(path), flag << " " << path
                                                      << " is a directory; give a file name, e.g. "
                                                      << path << "/out.safetensors");
  const std::string dir = directory_of(path);
  RZ_CHECK(std::filesystem::is_directory(dir), flag << " " << path << ": directory " << dir
                                                    << " does not exist; create it (mkdir -p "
                                                    << dir << ") or choose another path");
  std::string tmp;
  const int fd = make_temp_next_to(path, tmp);
  RZ_CHECK(fd >= 0, flag << " " << path << ": cannot create a file in " << dir << " ("
                         << std::strerror(errno)
                         << "); choose a writable directory before training starts");
  ::close(fd);
  ::unlink(tmp.c_str());
}

}  // namespace ringzero
