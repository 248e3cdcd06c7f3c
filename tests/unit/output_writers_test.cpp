// The two output writers of common/io/atomic_file.hpp under a full disk (issue 9: --metrics and the
// one atomic writer), with their expected messages and file contents written out. A file-size
// limit (RLIMIT_FSIZE, as `ulimit -f`) stands in for a full disk: write(2) fails with EFBIG
// once the limit is reached, as it fails with ENOSPC on a full disk; the writers ignore SIGXFSZ.
#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "common/io/atomic_file.hpp"
#include "util.hpp"

using namespace ringzero;
using namespace ringzero::test;
using Catch::Matchers::Contains;

namespace {

// Lowers the soft file-size limit to `bytes` for its lifetime.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ignore_file_size_signal();  // before the limit: past it, the default action kills us
    getrlimit(RLIMIT_FSIZE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = bytes;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lowered) == 0);
  }
  ~FileSizeLimit() { setrlimit(RLIMIT_FSIZE, &saved_); }

 private:
  rlimit saved_{};
};

}  // namespace

TEST_CASE("write_file_atomically: a full disk leaves the previous file and names the bytes",
          "[atomic_file][harden]") {
  TempDir dir;
  const std::string path = dir.file("out.safetensors");
  write_file_atomically(path, std::string(1000, 'a'));
  {
    FileSizeLimit limit(4096);
    REQUIRE_THROWS_WITH(
        write_file_atomically(path, std::string(10000, 'b'), {.advice = ". Free space"}),
        Contains("writing " + path +
                 " failed after 4096 of 10000 bytes (write: File too large "
                 "(disk full or file size limit?)); the previous file, if any, is intact. Free "
                 "space"));
  }
  REQUIRE(read_all(path) == std::string(1000, 'a'));  // untouched
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
  REQUIRE(files == 1);  // the temporary file is gone
}

TEST_CASE("RecordFile: a full disk leaves whole records only, and says how many",
          "[atomic_file][metrics][harden]") {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  std::string record = "{\"type\":\"step\",\"step\":1}";
  record += std::string(99 - record.size(), ' ') + "\n";  // 100 bytes, newline included
  {
    RecordFile file(path, "--metrics");
    FileSizeLimit limit(1050);  // room for 10 records and half of the 11th
    for (int i = 0; i < 10; ++i) file.append(record);
    REQUIRE_THROWS_WITH(
        file.append(record),
        Contains("writing --metrics " + path +
                 " failed at record 11 (File too large (disk full "
                 "or file size limit?)); the file keeps the 10 whole records before it. Free "
                 "space, or point --metrics elsewhere"));
    file.append(record);  // closed after the error: ignored, nothing written
  }
  const std::string text = read_all(path);
  REQUIRE(text.size() == 1000);  // not 1050: the cut record is gone
  std::istringstream lines(text);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) REQUIRE(line + "\n" == record);
  REQUIRE(n == 10);
}

TEST_CASE("RecordFile: an unwritable path fails at once, naming the flag",
          "[atomic_file][harden]") {
  REQUIRE_THROWS_WITH(RecordFile("/proc/no/m.jsonl", "--metrics"),
                      Contains("cannot write --metrics /proc/no/m.jsonl"));
}
