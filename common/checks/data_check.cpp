#include "common/checks/data_check.hpp"

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/core/check.hpp"

namespace ringzero {
namespace {

// One line per split: "<split>\t<size>\t<crc32>\t<source>".
std::string describe(const char* split, const Dataset& d) {
  char crc[16];
  std::snprintf(crc, sizeof crc, "0x%08x", d.crc32);
  return std::string(split) + "\t" + std::to_string(d.size) + "\t" + crc + "\t" + d.source;
}

struct Line {
  std::string split, size, crc, source;
};
Line parse(const std::string& text) {
  Line l;
  std::istringstream in(text);
  std::getline(in, l.split, '\t');
  std::getline(in, l.size, '\t');
  std::getline(in, l.crc, '\t');
  std::getline(in, l.source);
  return l;
}

}  // namespace

void verify_same_data(Communicator& comm, const TrainTestData& data) {
  const std::string mine = describe("training", data.train) + "\n" + describe("test", data.test);
  const std::vector<std::string> all = comm.gather_strings(mine, 0);
  std::string verdict;  // empty: every rank holds rank 0's data
  for (size_t r = 1; r < all.size() && verdict.empty(); ++r) {
    std::istringstream a(all[0]), b(all[r]);
    for (std::string la, lb; std::getline(a, la) && std::getline(b, lb);) {
      const Line x = parse(la), y = parse(lb);
      // Synthetic sets are compared by their parameters too; Fashion-MNIST copies may live in
      // different directories.
      const bool synthetic = x.source.rfind("synthetic", 0) == 0;
      if (x.size == y.size && x.crc == y.crc && (!synthetic || x.source == y.source)) continue;
      verdict = "rank " + std::to_string(r) + " loaded other " + x.split +
                " data than rank 0: " + "rank " + std::to_string(r) + " has " + y.size +
                " samples, CRC-32 " + y.crc + " from " + y.source + "; rank 0 has " + x.size +
                " samples, CRC-32 " + x.crc + " from " + x.source +
                ". Every rank must load the same data: give every rank the same --data-dir "
                "contents (and --seed for the synthetic set)";
      break;
    }
  }
  comm.broadcast_string(verdict, 0);  // every rank stops, with the same message
  RZ_CHECK(verdict.empty(), verdict);
}

}  // namespace ringzero
