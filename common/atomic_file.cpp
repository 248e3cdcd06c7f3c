#include "atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

void write_file_atomically(const std::string& path, std::string_view bytes) {
  RZ_CHECK(!path.empty(), "write_file_atomically: empty path");
  std::string tmp;
  const int fd = make_temp_next_to(path, tmp);
  RZ_CHECK(fd >= 0, "cannot write " << path << ": " << std::strerror(errno)
                                    << "; check the directory " << directory_of(path)
                                    << " exists and is writable");
  auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    RZ_CHECK(false, "writing " << path << " failed (" << what << ": " << reason
                               << "); the previous file, if any, is intact");
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
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
