#include "common/io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "common/core/check.hpp"

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

// What a stat(2) mode is, in words.
const char* kind_of_mode(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISCHR(mode)) return "a character device";
  return "not a regular file";
}

// A character device takes the bytes as they come (/dev/null, a terminal): no temporary file,
// no rename (which would replace the device node with a regular file).
void write_through(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  RZ_CHECK(fd >= 0, "cannot write " << path << ": " << std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason = std::strerror(n == 0 ? ENOSPC : errno);
      ::close(fd);
      RZ_CHECK(false, "writing " << path << " failed after " << done << " of " << bytes.size()
                                 << " bytes (" << reason << ")");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace

std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return kind_of_mode(st.st_mode);
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
    return "a dangling symbolic link";
  return "";
}

bool is_stream_path(const std::string& path) {
  return path == "/dev/stdout" || path == "/dev/stderr" || path.rfind("/dev/fd/", 0) == 0 ||
         path.rfind("/proc/self/fd/", 0) == 0;
}

OutputTarget resolve_output(const std::string& flag, const std::string& path,
                            const std::string& example_name) {
  struct stat st {};
  // This process's own streams: whatever they are (a terminal, a pipe, the file a shell
  // redirected to), written through and appended to, never replaced.
  if (is_stream_path(path) && ::stat(path.c_str(), &st) == 0) return {path, true};
  if (path.ends_with('/')) {  // "/" itself: only the example
    const std::string bare = path.substr(0, path.find_last_not_of('/') + 1);
    RZ_CHECK(false, flag << " " << path << " ends in /, so it names a directory; give a file path, "
                         << "e.g. " << path << example_name
                         << (bare.empty() ? "" : ", or " + bare + " without the /"));
  }
  if (::stat(path.c_str(), &st) != 0) {  // nothing there yet, or a link to nothing yet
    std::string p = path;
    for (int hops = 0; hops < 40; ++hops) {  // Linux's own limit on a chain of links
      struct stat link {};
      if (::lstat(p.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) return {p, false};
      std::vector<char> target(PATH_MAX + 1);
      const ssize_t n = ::readlink(p.c_str(), target.data(), PATH_MAX);
      RZ_CHECK(n > 0, flag << " " << path << ": cannot read the symbolic link " << p);
      const std::string t(target.data(), static_cast<size_t>(n));
      p = t[0] == '/' ? t : directory_of(p) + "/" + t;  // the file the link will create
    }
    RZ_CHECK(false, flag << " " << path << " is a loop of symbolic links; give a file path");
  }
  if (S_ISCHR(st.st_mode)) return {path, true};
  RZ_CHECK(!S_ISDIR(st.st_mode), flag << " " << path << " is a directory; give a file name, e.g. "
                                      << path << "/" << example_name);
  RZ_CHECK(S_ISREG(st.st_mode),
           flag << " " << path << " is " << kind_of_mode(st.st_mode)
                << "; an output must be a regular file (or a character device such as /dev/null): "
                   "give a file path");
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && !S_ISLNK(link.st_mode)) return {path, false};
  // A symlink (or a chain of them): the file it names is the one replaced, never the link.
  char* real = ::realpath(path.c_str(), nullptr);
  RZ_CHECK(real != nullptr, flag << " " << path << ": cannot resolve the symbolic link ("
                                 << std::strerror(errno) << ")");
  std::string target = real;
  std::free(real);
  return {target, false};
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::map<std::string, std::pair<std::string, std::string>> seen;  // file -> (flag, path)
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    const OutputTarget t = resolve_output(flag, path);
    if (t.device) continue;
    // An existing file by its inode (hard links too), a new one by its absolute path.
    std::string key = std::filesystem::weakly_canonical(std::filesystem::absolute(t.path));
    if (struct stat st {}; ::stat(t.path.c_str(), &st) == 0)
      key = "inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
    auto [it, fresh] = seen.emplace(key, std::make_pair(flag, path));
    RZ_CHECK(fresh, it->second.first << " " << it->second.second << " and " << flag << " " << path
                                     << " name the same file (" << t.path
                                     << "): one would overwrite the other; give each output its "
                                        "own file");
  }
}

void check_input_file(const std::string& what, const std::string& path, const std::string& fix) {
  const std::string kind = file_kind(path);
  RZ_CHECK(!kind.empty(), what << " " << path << ": no such file; " << fix);
  RZ_CHECK(kind == "a regular file", what << " " << path << " is " << kind
                                          << ", not a regular file; " << fix);
}

void ignore_file_size_signal() {
  std::signal(SIGXFSZ, SIG_IGN);
}

void write_file_atomically(const std::string& path, std::string_view bytes,
                           const AtomicWriteOptions& options) {
  RZ_CHECK(!path.empty(), "write_file_atomically: empty path");
  ignore_file_size_signal();
  const OutputTarget target = resolve_output("output", path);
  if (target.device) return write_through(target.path, bytes);
  const std::string& file = target.path;  // `path`, or the file its symlink names
  std::string tmp;
  const int fd = make_temp_next_to(file, tmp);
  RZ_CHECK(fd >= 0, "cannot write " << path << ": " << std::strerror(errno)
                                    << "; check the directory " << directory_of(file)
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
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    RZ_CHECK(false, "cannot replace " << path << ": " << reason
                                      << "; is it a directory, or on a read-only file system?");
  }
  // The rename is durable only once the directory entry is: fsync the directory too.
  const int dir = ::open(directory_of(file).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);  // best effort: some file systems refuse fsync on a directory
    ::close(dir);
  }
}

RecordFile::RecordFile(const std::string& path, std::string flag, bool truncate)
    : path_(path), flag_(std::move(flag)) {
  ignore_file_size_signal();
  const OutputTarget target = resolve_output(flag_, path);
  device_ = target.device;
  const mode_t mask = ::umask(0);
  ::umask(mask);
  const int mode = device_ ? O_APPEND : O_CREAT | (truncate ? O_TRUNC : 0);  // a stream: appended
  fd_ = ::open(target.path.c_str(), O_WRONLY | mode | O_CLOEXEC, 0666 & ~mask);
  RZ_CHECK(fd_ >= 0, "cannot write " << flag_ << " " << path << ": " << std::strerror(errno)
                                     << "; give a file path in an existing, writable directory");
  if (device_) return;  // a terminal cannot seek, and nothing is cut back on /dev/null
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
      const bool cut =
          !device_ && ::ftruncate(fd_, size_) == 0 && ::lseek(fd_, size_, SEEK_SET) == size_;
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

void check_output_path(const std::string& flag, const std::string& path,
                       const std::string& example_name) {
  if (path.empty()) return;
  const OutputTarget target = resolve_output(flag, path, example_name);  // not a directory, ...
  if (target.device) {  // a terminal that is not this process's, say: fails now, not at the end
    const int fd = ::open(target.path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    RZ_CHECK(fd >= 0, flag << " " << path << ": cannot open it for writing ("
                           << std::strerror(errno) << "); give a file path");
    ::close(fd);
    return;
  }
  const std::string dir = directory_of(target.path), kind = file_kind(dir);
  RZ_CHECK(kind.empty() || kind == "a directory", flag << " " << path << ": " << dir << " is "
                                                       << kind
                                                       << ", not a directory; choose another path");
  RZ_CHECK(!kind.empty(), flag << " " << path << ": directory " << dir
                               << " does not exist; create it (mkdir -p " << dir
                               << ") or choose another path");
  const std::string refused = file_creation_refused(target.path);
  RZ_CHECK(refused.empty(),
           flag << " " << path << ": cannot create a file in " << dir << " " << refused);
}

std::string file_creation_refused(const std::string& stem, const std::string& fix) {
  std::string tmp;
  const int fd = make_temp_next_to(stem, tmp), create_errno = errno;
  if (fd < 0)
    return std::string("(") + std::strerror(create_errno) +
           (create_errno == ENAMETOOLONG ? ", once .tmp.XXXXXX is added); give a shorter name"
                                         : "); " + fix);
  ::close(fd);
  const int removed = ::unlink(tmp.c_str()), remove_errno = errno;
  if (removed == 0) return "";
  // Files go in, none go out (chattr +a): the rename over the output would fail there too.
  return std::string("(a new file cannot be removed again: ") + std::strerror(remove_errno) +
         "; an append-only directory? the probe " + tmp + " stays there); " + fix;
}

}  // namespace ringzero
