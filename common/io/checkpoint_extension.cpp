// The checkpoint extension of the shared driver (common/driver/run.hpp): checkpoints in every
// chapter with no line in any main.cpp. Listed in run.cpp's extensions().
#include "common/core/check.hpp"
#include "common/driver/run.hpp"
#include "common/io/checkpoint.hpp"

namespace ringzero {

namespace {

class CheckpointExtension : public Extension {
 public:
  void validate(const RunState& run) override {
    checkpointer_ = std::make_unique<Checkpointer>(run.config, run.comm);
  }
  void after_setup(RunState& run) override {
    if (run.config.checkpoint_dir.empty() && run.config.resume.empty()) return;
    state_ = run.lesson->training_state(*run.model);
    state_.chapter = run.chapter.name;
    state_.data = {{"source", run.data->train.source},
                   {"size", run.data->train.size},
                   {"crc32", run.data->train.crc32}};
    const int64_t per_epoch = run.sampler->steps_per_epoch();
    const TrainPosition pos = checkpointer_->resume(state_, per_epoch);
    checkpointer_->check_checkpoint_dir();  // before step 1: writable, and no other run's
    // Nothing left to train: no step would run, and the summary would report losses never
    // measured. Refused, before the driver's loop.
    RZ_CHECK(run.config.resume.empty() || pos.step <= run.steps,
             "--resume " << run.config.resume << ": the checkpoint has " << pos.step
                         << " steps done, and this run stops at step " << run.steps << " (--epochs "
                         << run.config.epochs
                         << (run.config.max_steps > 0
                                 ? ", --max-steps " + std::to_string(run.config.max_steps)
                                 : std::string())
                         << "): it is past this run's end. Raise --max-steps or --epochs, or "
                            "read the checkpoint with scripts/consolidate");
    if (!run.config.resume.empty() && pos.step == run.steps)
      print0(
          "note: the checkpoint is at this run's last step: no step is trained; its state is "
          "written out (--save-final, --save-optimizer-state) and evaluated (unless "
          "--eval-every-epoch 0), and the summary's final loss is null (no step was measured)");
    // The driver derives epoch and position from the step count (every epoch has per_epoch
    // steps); the manifest's must agree.
    RZ_CHECK((pos.epoch - 1) * per_epoch + pos.t == pos.step,
             "--resume: the checkpoint's epoch " << pos.epoch << " and position " << pos.t
                                                 << " do not follow from its " << pos.step
                                                 << " steps at " << per_epoch << " per epoch");
    run.step = pos.step;
    run.resumed_step = pos.step;
    run.logger->continue_after(pos.step, per_epoch,  // the curve goes on in --metrics
                               run.config.eval_every_epoch != 0);
  }
  void after_step(RunState& run) override {
    if (run.config.checkpoint_dir.empty()) return;
    const int64_t per_epoch = run.sampler->steps_per_epoch();
    const int64_t epoch = 1 + (run.step - 1) / per_epoch;
    checkpointer_->after_step(state_, run.step, epoch, run.step - (epoch - 1) * per_epoch,
                              per_epoch, run.steps);
  }

 private:
  std::unique_ptr<Checkpointer> checkpointer_;
  TrainingState state_;
};

}  // namespace

std::unique_ptr<Extension> checkpoint_extension() {
  return std::make_unique<CheckpointExtension>();
}

}  // namespace ringzero
