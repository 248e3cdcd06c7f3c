#include "common/report/metrics.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/core/check.hpp"
#include "common/core/ledger.hpp"
#include "common/io/atomic_file.hpp"

namespace ringzero {

StepLogger::StepLogger(const std::string& metrics_path, int rank, int64_t log_every, bool resuming)
    : rank_(rank), log_every_(log_every) {
  // Opened (and a previous run's file truncated) at the first record, not here: a run refused
  // before step 1 (its --checkpoint-dir holds another run's checkpoints, say) must leave the
  // previous run's metrics as they were.
  if (rank == 0 && resuming) path_ = metrics_path;
  if (rank == 0 && !resuming) new_path_ = metrics_path;
}

StepLogger::~StepLogger() = default;

void StepLogger::continue_after(int64_t step, int64_t steps_per_epoch, bool evaluates) {
  if (rank_ != 0 || path_.empty()) return;
  if (resolve_output("--metrics", path_).device) {  // /dev/null, a terminal: nothing to keep
    file_ = std::make_unique<RecordFile>(path_, "--metrics", /*truncate=*/false);
    path_.clear();
    return;
  }
  std::string kept;
  if (std::ifstream in(path_); in) {
    for (std::string line; std::getline(in, line);) {
      // A line cut by the interrupted run's kill is not JSON: dropped.
      const nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (r.is_discarded() || !r.is_object() || !r.contains("type") || !r["type"].is_string())
        continue;  // not one of our records
      const std::string type = r["type"].get<std::string>();
      if (type == "summary") continue;
      auto number = [&](const char* key) {
        return r.contains(key) && r[key].is_number_integer() ? r[key].get<int64_t>() : 0;
      };
      if (type == "step" && number("step") > step) continue;
      // An evaluation at or after `step` is made again by the resumed run (run.cpp's loop
      // starts in the epoch of `step`): kept once, whether or not the stopped run got to it.
      const int64_t eval_end = number("epoch") * steps_per_epoch;  // the step it followed
      if (type == "eval" && (eval_end > step || (evaluates && eval_end == step))) continue;
      kept += line + "\n";
    }
  }
  write_file_atomically(path_, kept);
  file_ = std::make_unique<RecordFile>(path_, "--metrics", /*truncate=*/false);
  path_.clear();
}

void StepLogger::write(const nlohmann::json& record) {
  if (!new_path_.empty()) {
    file_ = std::make_unique<RecordFile>(new_path_, "--metrics");
    new_path_.clear();
  }
  if (file_) file_->append(record.dump() + "\n");  // whole lines only (atomic_file.hpp)
}

void StepLogger::step(int64_t step, int64_t total_steps, int64_t epoch, double loss,
                      double samples_per_s, double ms_per_step) {
  if (rank_ != 0) return;
  write({{"type", "step"},
         {"step", step},
         {"epoch", epoch},
         {"loss", loss},
         {"samples_per_s", samples_per_s},
         {"ms_per_step", ms_per_step}});
  if (step % log_every_ == 0 || step == total_steps || step == 1) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | epoch %lld | loss %.4f | %.0f samples/s | %.1f ms/step",
                  static_cast<long long>(step), static_cast<long long>(total_steps),
                  static_cast<long long>(epoch), loss, samples_per_s, ms_per_step);
    print0(line);
  }
}

void StepLogger::eval(int64_t epoch, double test_loss, double test_accuracy) {
  if (rank_ != 0) return;
  nlohmann::json rec = {{"type", "eval"}, {"epoch", epoch}, {"test_loss", test_loss}};
  char line[160];
  if (test_accuracy >= 0) {
    rec["test_accuracy"] = test_accuracy;
    std::snprintf(line, sizeof line, "epoch %lld | test loss %.4f | test accuracy %.2f%%",
                  static_cast<long long>(epoch), test_loss, 100.0 * test_accuracy);
  } else {
    rec["test_accuracy"] = nullptr;  // regression: no accuracy
    std::snprintf(line, sizeof line, "epoch %lld | test loss %.4f", static_cast<long long>(epoch),
                  test_loss);
  }
  write(rec);
  print0(line);
}

void StepLogger::summary(nlohmann::json fields) {
  if (rank_ != 0) return;
  fields["type"] = "summary";
  write(fields);
}

nlohmann::json ledger_json() {
  const Ledger& l = Ledger::get();
  nlohmann::json j;
  for (int t = 0; t < kNumMemTags; ++t) {
    auto tag = static_cast<MemTag>(t);
    j[mem_tag_name(tag)] = {{"current", l.current(tag)}, {"peak", l.peak(tag)}};
  }
  j["model_states_current"] = l.model_states_current();
  j["model_states_peak"] = l.model_states_peak();
  if (l.device_total_peak() > 0) {  // only on a --device cuda run: CPU output stays as it was
    nlohmann::json d;
    for (int t = 0; t < kNumMemTags; ++t) {
      auto tag = static_cast<MemTag>(t);
      d[mem_tag_name(tag)] = {{"current", l.device_current(tag)}, {"peak", l.device_peak(tag)}};
    }
    d["total_peak"] = l.device_total_peak();
    d["model_states_peak"] = l.device_model_states_peak();
    j["device"] = d;
  }
  return j;
}

double StepTimes::median_ms() const {
  if (ms_.empty()) return 0.0;
  std::vector<double> v(ms_.size() > 1 ? ms_.begin() + 1 : ms_.begin(), ms_.end());
  std::nth_element(v.begin(), v.begin() + static_cast<int64_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 4) {
    bytes /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string format_ledger(const std::vector<nlohmann::json>& per_rank,
                          const std::string& formula_line) {
  std::string out = "memory ledger per rank (current / peak):\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-5s", "rank");
  out += buf;
  const char* cols[] = {"parameters", "gradients",   "optimizer_state",
                        "padding",    "activations", "comm_buffers"};
  for (const char* c : cols) {
    std::snprintf(buf, sizeof buf, " | %-21s", c);
    out += buf;
  }
  out += " | model states peak\n";
  for (size_t r = 0; r < per_rank.size(); ++r) {
    std::snprintf(buf, sizeof buf, "  %-5zu", r);
    out += buf;
    for (const char* c : cols) {
      const auto& e = per_rank[r].at(c);
      std::string cell = human_bytes(e.at("current").get<double>()) + " / " +
                         human_bytes(e.at("peak").get<double>());
      std::snprintf(buf, sizeof buf, " | %-21s", cell.c_str());
      out += buf;
    }
    out += " | " + human_bytes(per_rank[r].at("model_states_peak").get<double>()) + "\n";
    if (per_rank[r].contains("device")) {  // the same tags in GPU memory (--device cuda)
      const auto& dev = per_rank[r].at("device");
      std::snprintf(buf, sizeof buf, "  %-5s", ("gpu" + std::to_string(r)).c_str());
      out += buf;
      for (const char* c : cols) {
        const auto& e = dev.at(c);
        std::string cell = human_bytes(e.at("current").get<double>()) + " / " +
                           human_bytes(e.at("peak").get<double>());
        std::snprintf(buf, sizeof buf, " | %-21s", cell.c_str());
        out += buf;
      }
      out += " | device total peak " + human_bytes(dev.at("total_peak").get<double>()) + "\n";
    }
  }
  return out + "  " + formula_line;
}

}  // namespace ringzero
