#include "finite_check.hpp"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "check.hpp"

namespace ringzero {

void check_finite_loss(Communicator& comm, double local_loss, double global_loss, int64_t step) {
  if (std::isfinite(global_loss)) return;
  std::ostringstream mine;
  mine << local_loss;
  const std::vector<std::string> all = comm.gather_strings(mine.str(), 0);
  std::string verdict;
  if (comm.rank() == 0) {
    std::string bad, values;
    for (size_t r = 0; r < all.size(); ++r) {
      const double v = std::strtod(all[r].c_str(), nullptr);
      if (std::isfinite(v) && all[r] != "nan" && all[r] != "-nan") continue;
      bad += (bad.empty() ? "" : ", ") + std::to_string(r);
      values += (values.empty() ? "" : ", ") + all[r];
    }
    std::ostringstream os;
    os << "loss is " << global_loss << " at step " << step << " (global-batch mean); ";
    if (bad.empty())
      os << "every rank's own loss is finite: their sum overflowed";
    else
      os << "non-finite first on rank(s) " << bad << " (local loss " << values
         << "), finite on the others";
    os << "; training diverged: lower --lr or set --clip-grad-norm (e.g. 1.0)";
    verdict = os.str();
  }
  comm.broadcast_string(verdict, 0);  // every rank stops with the same message
  RZ_CHECK(false, verdict);
}

}  // namespace ringzero
