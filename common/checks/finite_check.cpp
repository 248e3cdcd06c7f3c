#include "common/checks/finite_check.hpp"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/optim.hpp"
#include "common/driver/run.hpp"

namespace ringzero {

namespace {

// The scan's finding on this rank (main thread only: hooks run in backward, on the main thread).
int64_t g_bad_step = 0;  // 0: every gradient so far was finite
std::string g_bad_where;

// "1, 3" and "step 4: net.0.weight[12] = inf; ..." from every rank's finding, on rank 0.
void first_bad_ranks(const std::vector<std::string>& all, std::string& ranks, std::string& where,
                     int64_t& step) {
  step = 0;
  for (const std::string& s : all) {
    const int64_t st = s.empty() ? 0 : std::stoll(s);
    if (st > 0 && (step == 0 || st < step)) step = st;
  }
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty() || std::stoll(all[r]) != step) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    where += (where.empty() ? "" : "; ") + all[r].substr(all[r].find(' ') + 1);
  }
}

std::string gradient_finding() {
  return g_bad_step == 0 ? std::string() : std::to_string(g_bad_step) + " " + g_bad_where;
}

// Collective: every rank's scan finding; on every rank, "" or the sentence naming the first step
// and the rank(s).
std::string gradient_verdict(Communicator& comm) {
  const std::vector<std::string> all = comm.gather_strings(gradient_finding(), 0);
  std::string verdict;
  if (comm.rank() == 0) {
    std::string ranks, where;
    int64_t step = 0;
    first_bad_ranks(all, ranks, where, step);
    if (step > 0)
      verdict = "the gradient first became non-finite at step " + std::to_string(step) +
                " on rank(s) " + ranks + " (" + where + ", this rank's own gradient before " +
                "the reduction), finite on the others before that";
  }
  comm.broadcast_string(verdict, 0);
  return verdict;
}

class GradientScan : public Extension {
 public:
  void before_lesson(RunState& s) override {
    // Distributed fp32 runs only: a 16-bit run's loss scaler expects and skips inf gradients.
    if (s.comm == nullptr || s.config.precision != "fp32") return;
    state_ = &s;
    for (Parameter* p : s.model->parameters())
      p->add_grad_ready_hook([this](Parameter& param) { scan(param); });
  }
  // The run ended with a non-finite gradient the loss never showed (the last step's): stop
  // every rank before --save-final writes the weights it produced.
  void report(RunState& s, nlohmann::json&) override {
    if (state_ == nullptr) return;
    const std::string verdict = gradient_verdict(*s.comm);
    RZ_CHECK(verdict.empty(),
             verdict << "; training diverged: lower --lr or set --clip-grad-norm (e.g. 1.0)");
  }

 private:
  void scan(Parameter& p) {
    if (g_bad_step != 0 || p.grad.numel() == 0) return;  // the first one is the one to name
    // On a device: Σ g² in float64 is finite exactly when every element is (no float32 square
    // overflows a double), so only a gradient with a non-finite element comes to the host.
    if (p.grad.device() != Device::cpu && std::isfinite(sum_of_squares(p.grad.span()))) return;
    const Tensor grad = p.grad.to(Device::cpu, MemTag::activations);  // itself on the host
    const float* g = grad.data();
    const int64_t n = grad.numel();
    bool finite = true;
    for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(g[i]);  // vectorises; no branch
    if (finite) return;
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(g[i])) {
        std::ostringstream os;
        os << "step " << state_->step << ": " << p.name() << "[" << i << "] = " << g[i];
        g_bad_step = state_->step;
        g_bad_where = os.str();
        return;
      }
  }
  const RunState* state_ = nullptr;
};

}  // namespace

std::string first_nonfinite_gradient() {
  return g_bad_step == 0 ? "" : g_bad_where;
}

std::unique_ptr<Extension> gradient_scan_extension() {
  return std::make_unique<GradientScan>();
}

void check_finite_loss(Communicator& comm, double local_loss, double global_loss, int64_t step) {
  if (std::isfinite(global_loss)) return;
  std::ostringstream mine;
  mine << local_loss;
  const std::vector<std::string> all = comm.gather_strings(mine.str(), 0);
  const std::string gradient = gradient_verdict(comm);
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
    if (!gradient.empty()) os << "; " << gradient;
    os << "; training diverged: lower --lr or set --clip-grad-norm (e.g. 1.0)";
    verdict = os.str();
  }
  comm.broadcast_string(verdict, 0);  // every rank stops with the same message
  RZ_CHECK(false, verdict);
}

}  // namespace ringzero
