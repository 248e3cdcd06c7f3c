// The end of a run (Run::report, run.hpp declares it): the trace file, the memory ledger and
// traffic report (every rank's, from rank 0), the summary line and JSON, then --save-final and
// --save-optimizer-state, gathered last because gathering sharded state is not training traffic.
#include "common/core/check.hpp"
#include "common/core/ledger.hpp"
#include "common/driver/run.hpp"
#include "common/io/safetensors.hpp"
#include "common/report/dist.hpp"
#include "common/report/trace.hpp"

namespace ringzero {

void Run::report(RunState& state, const nlohmann::json& startup, double median_ms) {
  Lesson& lesson = *state.lesson;
  const int64_t psi = state.model->num_parameters();
  if (!trace_path_.empty()) write_chrome_trace(*comm_, *state.tracer, trace_path_);
  nlohmann::json summary;
  if (comm_) {
    // Per step of THIS process: its counters started at zero after a --resume.
    summary = end_of_run_report(*comm_, state.step - state.resumed_step, startup,
                                lesson.ledger_formula(psi), lesson.traffic_theory());
  } else {
    const nlohmann::json ledger = ledger_json();
    print0(format_ledger({ledger}, lesson.ledger_formula(psi)));
    summary = {{"model_states_bytes_per_rank", ledger["model_states_peak"]},
               {"bytes_sent_per_rank_per_step", 0},
               {"ledger", {ledger}}};
  }
  if (state.rank == 0) {
    summary.update({{"chapter", chapter_.name},
                    {"world_size", state.world_size},
                    {"steps", state.step},
                    {"steps_run", state.step - state.resumed_step},
                    {"final_loss", state.loss},
                    {"test_loss", state.test_loss},
                    {"test_accuracy", state.test_accuracy},
                    {"ms_per_step", median_ms},
                    {"num_parameters", psi}});
    summary.update(lesson.summary_fields());
    if (state.step == state.resumed_step) {  // resumed at the last step: no step was measured
      for (const char* k : {"final_loss", "ms_per_step"}) summary[k] = nullptr;
      if (!config_.eval_every_epoch)
        for (const char* k : {"test_loss", "test_accuracy"}) summary[k] = nullptr;
    }
  }
  for (auto& e : extensions_) e->report(state, summary);
  if (state.rank == 0) state.logger->summary(summary);

  // Files last: gathering sharded state is traffic, but not training traffic.
  if (!config_.save_final.empty()) {
    auto tensors = lesson.model_state_dict(*state.model);
    if (state.rank == 0) save_safetensors(config_.save_final, tensors);
  }
  if (!optimizer_state_path_.empty()) {
    auto tensors = lesson.saved_optimizer_state();
    RZ_CHECK(tensors, "--save-optimizer-state: chapter " << chapter_.name
                                                         << " does not expose its optimizer state");
    if (state.rank == 0) save_safetensors(optimizer_state_path_, *tensors);
  }
}

}  // namespace ringzero
