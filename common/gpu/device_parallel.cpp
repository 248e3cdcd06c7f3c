// DeviceParallel: the distributed chapters' optimizer step on a GPU (--device cuda), one class
// per chapter's idea, on DeviceTrainer (the local forward and backward) and DeviceComm (NCCL,
// or MPI through pinned host memory). See common/device_train.hpp for the interface.
//
// What each chapter does on the device (every collective on device buffers, counted in the host
// Communicator's counters under the CPU chapter's names, so the traffic table is the same):
//   03 central     ranks 1..N−1 send their gradient to rank 0, which adds them in rank order,
//                  divides by N, clips and steps (it alone holds optimizer state) and sends
//                  the parameters back ("central_reduce", "central_broadcast").
//   04 all_reduce  each parameter's gradient all-reduced after backward: chapter 04's ring
//                  (ring.hpp's template over DeviceComm, its hop's add a CUDA kernel), or the
//                  transport's all-reduce (--collectives mpi: ncclAllReduce on NCCL), then / N.
//   05 buckets     each bucket all-reduced as soon as backward has written its last gradient
//                  (the trainer's after_layer_backward hook), on the last micro-step only
//                  (no_sync), then / N.
//   06 zero 1      gradients in chapter 06's padded bucket layout; each bucket reduce-scattered
//                  as backward completes it (in place: chunk r is rank r's shard), / N; AdamW or
//                  SGD on the shard only (optimizer state Σ s per rank); parameters all-gathered.
//   07 zero 2      as 06, but no flat gradient buffer: a bucket's gradient lives in one of two
//                  reused buffers from its first write to its reduce-scatter, whose chunk / N
//                  goes to the gradient shard before the buffer is taken again (with K > 1 every
//                  bucket has its own and accumulates through no_sync, as chapter 07).
//   08 zero 3      only the shards of every layer's parameters and gradients; a layer is
//                  all-gathered before its forward and again before its backward (prefetch: the
//                  next one's gather is posted as a layer starts), its gradient reduce-scattered
//                  per micro-step and its chunk / N added to the shard; two gather and two
//                  gradient buffers; each collective first swaps chapter 08's 16-byte desync
//                  header (host MPI).
// Overlap (--collectives mpi, i.e. the transport's collectives, on NCCL): every collective is
// queued on the NCCL communicator's one communication stream after an event recorded on the
// compute stream (it reads finished gradients); the compute stream waits for a collective's
// event only where its result is used (DeviceComm::wait), so buckets reduce while backward goes
// on and the next layer is gathered while this one computes. The ring (--collectives ring, the
// CPU chapters' default) is host-driven hop by hop and the staged transport is blocking: both
// run in line with compute.
// --check-collectives (05-07) checks each bucket collective the same way, counted as metrics.
// Clipping: the global L2 norm from each rank's Σ g² over what it holds (the whole gradient, or
// its shards), summed over ranks as "metrics". The loss: the mean of every rank's mean, as on
// the CPU (global_mean), and the same NaN guard.
// --trace: CUDA events (DeviceClock) on both streams during the traced steps: each layer's
// forward and backward and the optimizer step on the compute stream's track, every collective on
// the communication stream's (Tracer::kGpuComputeTrack, kGpuCommTrack), aligned to the host
// clock by a mark recorded while the GPU is idle at the step's start.
// Leaves out: overlap on the staged transport and for the ring, 16-bit
// training, checkpoints (DeviceExtension refuses those flags), unused parameters.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/sharded_clip.hpp"
#include "common/check.hpp"
#include "common/checkpoint.hpp"
#include "common/collective_check.hpp"
#include "common/device_train.hpp"
#include "common/dist_eval.hpp"
#include "common/finite_check.hpp"
#include "common/gpu/device.hpp"
#include "common/gpu/staged_comm.hpp"
#include "common/lesson.hpp"
#include "common/optim.hpp"
#ifdef RINGZERO_NCCL
#include "common/gpu/nccl_comm.hpp"
#endif

namespace ringzero {

namespace {

std::span<float> dspan(float* p, int64_t n) {
  return {p, static_cast<size_t>(n)};
}

/// AdamW or SGD (--optimizer, the run's hyperparameters) over n contiguous device elements,
/// with its state for those elements only (a shard, or the whole model). Every element steps
/// together, so one step count serves them all (torch keeps one per parameter, all equal).
class DeviceOptimizer {
 public:
  DeviceOptimizer(const TrainConfig& c, int64_t n) : config_(c), n_(n) {
    if (c.optimizer == "adamw") {
      adamw_ = AdamWOptions{.lr = c.lr, .weight_decay = c.weight_decay};
      exp_avg_ = DeviceBuffer(n, MemTag::optimizer_state);
      exp_avg_sq_ = DeviceBuffer(n, MemTag::optimizer_state);
    } else if (c.momentum > 0) {
      momentum_buffer_ = DeviceBuffer(n, MemTag::optimizer_state);
    }
  }
  void begin_step() { ++step_; }
  /// Elements [offset, offset + n) of the state update p (n floats) from g (n floats).
  void update(float* p, const float* g, int64_t offset, int64_t n) {
    RZ_CHECK(offset >= 0 && offset + n <= n_, "optimizer range " << offset << "+" << n
                                                                 << " outside " << n_);
    if (n == 0) return;
    if (config_.optimizer == "adamw") {
      const kernels::AdamWStep k = adamw_step_constants(adamw_, step_);
      gpu::adamw_update(p, exp_avg_.data() + offset, exp_avg_sq_.data() + offset, g, n, k);
    } else {
      gpu::sgd_update(p, config_.momentum > 0 ? momentum_buffer_.data() + offset : nullptr, g, n,
                      config_.lr, config_.momentum, config_.weight_decay, step_ == 1);
    }
  }

 private:
  TrainConfig config_;
  int64_t n_ = 0, step_ = 0;
  AdamWOptions adamw_;
  DeviceBuffer exp_avg_, exp_avg_sq_, momentum_buffer_;
};

/// The transport every rank agrees on: NCCL where each rank of a node has its own GPU (or when
/// asked for), else the staged one. Sets `device` to the GPU this rank uses.
std::unique_ptr<DeviceComm> make_device_comm(Communicator& comm, const std::string& transport,
                                             bool need_nccl, int& device) {
  int visible = 1;
#ifdef RINGZERO_NCCL
  std::string why;
  visible = gpu_device_count(&why);
  RZ_CHECK(visible > 0, "--device cuda: no CUDA device (" << why
                                                          << "); run on a machine with an NVIDIA "
                                                             "GPU and driver, or use --device cpu");
  // NCCL needs a GPU per rank: does every rank of every node have one?
  std::vector<double> short_of_gpus{comm.local_rank() >= visible ? 1.0 : 0.0};
  comm.all_reduce_metrics(short_of_gpus);
  const bool nccl_fits = short_of_gpus[0] == 0;
  RZ_CHECK(transport != "nccl" || nccl_fits,
           "--gpu-transport nccl: rank " << comm.rank() << " is local rank " << comm.local_rank()
                                         << " but " << visible
                                         << " GPU(s) are visible, and NCCL needs one GPU per rank; "
                                            "use --gpu-transport staged (ranks share GPUs) or "
                                            "fewer ranks per node");
  RZ_CHECK(!need_nccl || nccl_fits,
           "--collectives nccl: rank " << comm.rank() << " is local rank " << comm.local_rank()
                                       << " but " << visible
                                       << " GPU(s) are visible, and NCCL needs one GPU per rank; "
                                          "use --collectives mpi with --gpu-transport staged, or "
                                          "fewer ranks per node");
  if (transport == "nccl" || (transport == "auto" && nccl_fits)) {
    auto nccl = std::make_unique<NcclCommunicator>(comm);
    device = nccl->device();
    return nccl;
  }
#else
  RZ_CHECK(transport != "nccl" && !need_nccl,
           (need_nccl ? "--collectives nccl" : "--gpu-transport nccl")
               << ": this build has no NCCL; use --gpu-transport staged or auto, and --collectives "
                  "ring or mpi");
#endif
  device = comm.local_rank() % visible;
  return std::make_unique<StagedCommunicator>(comm);
}

class DeviceParallelImpl final : public DeviceParallel, public DeviceLayerHooks {
 public:
  DeviceParallelImpl(const Model& model, const TrainConfig& config, Communicator& comm,
                     const DevicePlan& plan, const TrainingState& state)
      : comm_(comm), plan_(plan), N_(comm.world_size()), r_(comm.rank()) {
    int device = 0;
    dc_ = make_device_comm(comm, plan.transport, plan.nccl_collectives, device);
    name_ = require_gpu(device);
    psi_ = model.num_parameters();
    sizes_ = config.layer_sizes();
    const auto& params = model.parameters();
    offsets_ = model.offsets();
    for (const Parameter* p : params) numels_.push_back(p->numel());
    DeviceTrainerOptions options;
    options.optimizer = false;
    if (plan.kind == DevicePlan::Kind::central || plan.kind == DevicePlan::Kind::all_reduce ||
        plan.kind == DevicePlan::Kind::buckets) {
      if (plan.kind == DevicePlan::Kind::buckets) map_ranges_to_params(/*padded=*/false);
      trainer_ = make_device_trainer(model, config, device, options);
      if (plan.kind != DevicePlan::Kind::central || r_ == 0)
        optimizer_ = std::make_unique<DeviceOptimizer>(config, psi_);
      int64_t largest = 0;
      for (int64_t n : numels_) largest = std::max(largest, n);
      for (const auto& b : plan.ranges) largest = std::max(largest, b.size);
      // central: one incoming gradient; rings: one incoming chunk of the largest collective
      scratch_ = DeviceBuffer(plan.kind == DevicePlan::Kind::central ? psi_ : ceil_div(largest, N_),
                              MemTag::comm_buffers);
    } else if (plan.zero_stage == 1 || plan.zero_stage == 2) {
      map_ranges_to_params(/*padded=*/true);
      options.offsets = padded_param_offsets_;
      options.flat_size = padded_total_;
      options.flat_grads = plan.zero_stage == 1;
      trainer_ = make_device_trainer(model, config, device, options);
      optimizer_ = std::make_unique<DeviceOptimizer>(config, shard_total_);
      if (plan.zero_stage == 2) {
        shard_grads_ = DeviceBuffer(shard_total_, MemTag::gradients);
        // Two buckets' memory, reused (DeepSpeed's double-buffered reduce bucket); with K > 1
        // every bucket lives through no_sync and accumulates, as in chapter 07.
        const size_t slots =
            std::min(config.grad_accum_steps > 1 ? plan.ranges.size() : 2, plan.ranges.size());
        std::vector<int64_t> slot_size(slots, 0);  // slot j holds buckets j, j + slots, ...
        for (size_t b = 0; b < plan.ranges.size(); ++b)
          slot_size[b % slots] = std::max(slot_size[b % slots], shard_size_[b] * N_);
        for (int64_t n : slot_size) bucket_pool_.emplace_back(n, MemTag::gradients);
        slot_owner_.assign(bucket_pool_.size(), -1);
      }
      ticket_.assign(plan.ranges.size(), -1);
      scratch_ = DeviceBuffer(max_shard_, MemTag::comm_buffers);
    } else {
      RZ_CHECK(plan.zero_stage == 3, "zero stage " << plan.zero_stage << " has no GPU step");
      options.flat_params = options.flat_grads = false;
      for (size_t l = 0; l < plan.ranges.size(); ++l) {
        const auto& layer = plan.ranges[l];
        RZ_CHECK(l < sizes_.size() - 1 && layer.offset == offsets_[2 * l] &&
                     layer.size == numels_[2 * l] + numels_[2 * l + 1] &&
                     (layer.size + layer.padding) % N_ == 0,
                 "ZeRO-3 layer " << l << " (offset " << layer.offset << ", " << layer.size
                                 << " elements) is not the model's layer " << l);
        layer_shard_offset_.push_back(shard_total_);
        shard_total_ += (layer.size + layer.padding) / N_;
        max_shard_ = std::max(max_shard_, (layer.size + layer.padding) / N_);
      }
      trainer_ = make_device_trainer(model, config, device, options);
      shard_params_ = DeviceBuffer(shard_total_, MemTag::parameters);
      shard_grads_ = DeviceBuffer(shard_total_, MemTag::gradients);
      optimizer_ = std::make_unique<DeviceOptimizer>(config, shard_total_);
      scratch_ = DeviceBuffer(max_shard_, MemTag::comm_buffers);
      // Two layers in flight: the one computing and the one being gathered (prefetch), and two
      // layer gradients: the one backward writes and the one being reduce-scattered.
      for (int i = 0; i < 2; ++i) {
        gather_buf_[i] = DeviceBuffer(max_shard_ * N_, MemTag::comm_buffers);
        grad_buf_[i] = DeviceBuffer(max_shard_ * N_, MemTag::comm_buffers);
      }
      const auto L = static_cast<int64_t>(plan.ranges.size());
      for (int64_t l = 0; l < L; ++l) gather_order_.push_back({l, false});
      for (int64_t l = L - 1; l >= 0; --l) gather_order_.push_back({l, true});
      for (const StatePiece& piece : state.pieces) {  // this rank's shards, from the host
        const int64_t l = layer_of_piece(piece);
        shard_params_.copy_from_host(piece.params.data(), real_of_piece(l, piece),
                                     layer_shard_offset_[l]);
      }
    }
  }

  double train_step(const Step& step) override {
    if (step.tracer.enabled()) begin_trace(step.tracer);
    const int64_t K = step.config.grad_accum_steps;
    const DevicePlan::Kind kind = plan_.kind;
    const int stage = plan_.zero_stage;
    if (trainer_->grads()) trainer_->zero_grad();
    if (shard_grads_.size() > 0) shard_grads_.zero();
    double loss_sum = 0;
    for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
      last_micro_step_ = micro_step + 1 == K;
      begin_backward();
      loss_sum += trainer_->forward_backward(step.micro_batch(micro_step), 1.0f / K, this);
      end_backward();
    }
    const double loss_value = global_mean(comm_, loss_sum / K);  // equal shares: mean of means
    check_finite_loss(comm_, loss_sum / K, loss_value, step.step);
    const float max_norm = step.config.clip_grad_norm;
    const int step_mark = clock_mark();
    if (optimizer_) optimizer_->begin_step();
    switch (kind) {
      case DevicePlan::Kind::central:
        central_step(max_norm);
        break;
      case DevicePlan::Kind::all_reduce:
        for (size_t p = 0; p < numels_.size(); ++p) all_reduce(offsets_[p], numels_[p]);
        [[fallthrough]];
      case DevicePlan::Kind::buckets:  // every bucket was all-reduced during backward
        dc_->wait_async();
        gpu::scale(trainer_->grads(), psi_, 1.0f / static_cast<float>(N_));
        clip({{trainer_->grads(), psi_}}, max_norm, /*sum_over_ranks=*/false);
        optimizer_->update(trainer_->params(), trainer_->grads(), 0, psi_);
        break;
      case DevicePlan::Kind::zero:
        stage == 3 ? zero3_step(max_norm) : zero12_step(max_norm);
        break;
    }
    compute_span(kind == DevicePlan::Kind::zero ? "optimizer step (shard) + all-gather"
                                                : "all-reduce wait + optimizer step",
                 -1, step_mark);
    device_synchronize();
    if (tracer_) end_trace();
    return loss_value;
  }

  void copy_to_host(Model& model, const TrainingState& state) override {
    device_synchronize();
    if (plan_.zero_stage == 3) {  // this rank's shards into the lesson's
      for (const StatePiece& piece : state.pieces) {
        const int64_t l = layer_of_piece(piece);
        shard_params_.copy_to_host(piece.params.data(), real_of_piece(l, piece),
                                   layer_shard_offset_[l]);
      }
      return;
    }
    const auto& params = model.parameters();  // every parameter is whole on every rank
    const std::vector<int64_t>& at = plan_.kind == DevicePlan::Kind::zero ? padded_param_offsets_
                                                                          : offsets_;
    for (size_t p = 0; p < params.size(); ++p)
      if (params[p]->data.data() != nullptr)
        ringzero::copy_to_host(params[p]->data.data(), trainer_->params() + at[p],
                               numels_[p] * 4);
  }

  const std::string& device_name() const override { return name_; }
  std::string transport() const override { return dc_->transport(); }
  bool overlaps() const override { return dc_->overlaps(); }

  // DeviceLayerHooks ------------------------------------------------------------------------

  const float* layer_params(int64_t l, bool backward) override {
    const float* p = zero3_layer_params(l, backward);
    layer_mark_ = clock_mark();  // after the gather's wait: the layer's kernels start here
    return p;
  }
  void after_layer_forward(int64_t l) override {
    compute_span("forward ", l, layer_mark_);
  }

  const float* zero3_layer_params(int64_t l, bool backward) {
    if (plan_.zero_stage != 3) return nullptr;
    const size_t i = next_gather_++;
    RZ_CHECK(i < gather_order_.size() && gather_order_[i].layer == l &&
                 gather_order_[i].backward == backward,
             "ZeRO-3 on the GPU: layer " << l << (backward ? " backward" : " forward")
                                         << " out of the forward-then-backward order");
    if (posted_gathers_ <= i) post_gather(i);
    dc_->wait(gather_ticket_[i % 2]);  // the compute stream waits; the host goes on
    // Prefetch: the next layer's gather runs on the communication stream while this one
    // computes (its buffer's last reader, layer i - 1, was queued before: the event orders it).
    if (plan_.prefetch && i + 1 < gather_order_.size()) post_gather(i + 1);
    return gather_buf_[i % 2].data();
  }

  void layer_grads(int64_t l, float*& dweight, float*& dbias) override {
    if (plan_.zero_stage == 3) {
      const int slot = static_cast<int>(l % 2);
      finish_layer_reduce(slot);  // layer l + 2's reduce-scatter read this buffer
      grad_buf_[slot].zero();
      dweight = grad_buf_[slot].data();
      dbias = dweight + numels_[2 * l];
    } else if (plan_.zero_stage == 2) {
      dweight = bucket_grad(2 * l);
      dbias = bucket_grad(2 * l + 1);
    }
  }

  void after_layer_backward(int64_t l) override {
    compute_span("backward ", l, layer_mark_);
    if (plan_.kind == DevicePlan::Kind::central || plan_.kind == DevicePlan::Kind::all_reduce)
      return;
    if (plan_.zero_stage == 3) {
      post_layer_reduce(l);
      return;
    }
    if (!last_micro_step_) return;  // no_sync: buckets accumulate until the last micro-step
    for (int64_t p : {2 * l + 1, 2 * l}) {
      const int b = bucket_of_param_[p];
      if (--remaining_[b] > 0) continue;
      const auto& bucket = plan_.ranges[b];
      if (plan_.kind == DevicePlan::Kind::buckets) {
        check_in_step(b, 3);
        all_reduce(bucket.offset, bucket.size, /*async=*/true);
      } else {  // ZeRO-1: the flat gradient's bucket; ZeRO-2: the bucket's own buffer
        float* g = plan_.zero_stage == 1 ? trainer_->grads() + padded_offset_[b]
                                         : bucket_pool_[slot_of(b)].data();
        ticket_[b] = reduce_scatter_bucket(g, b);
      }
    }
  }

 private:
  // --trace: a DeviceClock while the tracer records; spans of both streams into its tracks.
  void begin_trace(Tracer& tracer) {
    device_synchronize();  // the GPU idles: mark 0 completes at once, at about origin_us_
    tracer_ = &tracer;
    origin_us_ = tracer.now_us();
    clock_.mark();
    dc_->set_clock(&clock_);
  }
  int clock_mark() { return tracer_ ? clock_.mark() : -1; }
  // A span named `what` (+ the layer, if >= 0) from mark `begin` to now; nothing untraced.
  void compute_span(const char* what, int64_t layer, int begin) {
    if (!tracer_ || begin < 0) return;
    compute_spans_.push_back(
        {what + (layer >= 0 ? std::to_string(layer) : ""), begin, clock_.mark()});
  }
  void end_trace() {
    dc_->set_clock(nullptr);
    const std::vector<double> us = clock_.resolve();
    for (const DeviceSpan& s : compute_spans_)
      tracer_->complete(s.name, "gpu", Tracer::kGpuComputeTrack, origin_us_ + us[s.begin],
                        us[s.end] - us[s.begin]);
    for (const DeviceSpan& s : dc_->take_spans())
      tracer_->complete(s.name, "gpu", Tracer::kGpuCommTrack, origin_us_ + us[s.begin],
                        us[s.end] - us[s.begin], {{"transport", dc_->transport()}});
    compute_spans_.clear();
    tracer_ = nullptr;
  }

  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

  void begin_backward() {
    remaining_ = params_per_range_;
    next_gather_ = posted_gathers_ = 0;
  }
  void end_backward() {
    if (plan_.zero_stage == 3) {
      finish_layer_reduce(0);
      finish_layer_reduce(1);
      return;
    }
    if (!last_micro_step_) return;
    for (size_t b = 0; b < remaining_.size(); ++b)
      RZ_CHECK(remaining_[b] == 0, "bucket " << b << ": backward did not write every gradient");
    if (plan_.zero_stage == 2)
      for (size_t b = 0; b < plan_.ranges.size(); ++b) finish_bucket(static_cast<int>(b));
  }

  // Buckets (05-07): which parameters each range holds, and the padded layout (06-07).
  void map_ranges_to_params(bool padded) {
    const size_t P = numels_.size();
    bucket_of_param_.assign(P, -1);
    params_per_range_.assign(plan_.ranges.size(), 0);
    for (size_t b = 0; b < plan_.ranges.size(); ++b) {
      const auto& r = plan_.ranges[b];
      RZ_CHECK(!padded || (r.size + r.padding) % N_ == 0,
               "bucket " << b << ": " << r.size << " + " << r.padding << " padding is not a "
                         << "multiple of world_size " << N_);
      for (size_t p = 0; p < P; ++p)
        if (offsets_[p] >= r.offset && offsets_[p] < r.offset + r.size) {
          RZ_CHECK(offsets_[p] + numels_[p] <= r.offset + r.size && bucket_of_param_[p] < 0,
                   "bucket " << b << " splits or repeats parameter " << p);
          bucket_of_param_[p] = static_cast<int>(b);
          ++params_per_range_[b];
        }
    }
    for (size_t p = 0; p < P; ++p)
      RZ_CHECK(bucket_of_param_[p] >= 0, "parameter " << p << " is in no bucket");
    if (!padded) return;
    // The padded flat buffer keeps the model's memory order, each bucket followed by its padding.
    std::vector<size_t> by_offset(plan_.ranges.size());
    std::iota(by_offset.begin(), by_offset.end(), 0);
    std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
      return plan_.ranges[a].offset < plan_.ranges[b].offset;
    });
    padded_offset_.assign(plan_.ranges.size(), 0);
    for (size_t b : by_offset) {
      padded_offset_[b] = padded_total_;
      padded_total_ += plan_.ranges[b].size + plan_.ranges[b].padding;
    }
    for (size_t b = 0; b < plan_.ranges.size(); ++b) {  // shards in plan order
      shard_size_.push_back((plan_.ranges[b].size + plan_.ranges[b].padding) / N_);
      shard_offset_.push_back(shard_total_);
      shard_total_ += shard_size_.back();
      max_shard_ = std::max(max_shard_, shard_size_.back());
    }
    for (size_t p = 0; p < P; ++p) {
      const int b = bucket_of_param_[p];
      padded_param_offsets_.push_back(padded_offset_[b] + offsets_[p] - plan_.ranges[b].offset);
    }
  }

  // ZeRO-2: bucket b's buffer in the pool; parameter p's gradient in it. The buffer is taken at
  // the bucket's first write of the step: the bucket that held it before is finished first.
  int slot_of(int b) const { return b % static_cast<int>(bucket_pool_.size()); }
  float* bucket_grad(int64_t p) {
    const int b = bucket_of_param_[p], slot = slot_of(b);
    if (slot_owner_[slot] != b) {
      if (slot_owner_[slot] >= 0) {
        RZ_CHECK(ticket_[slot_owner_[slot]] >= 0,
                 "ZeRO-2 on the GPU: bucket " << b << " needs the memory of bucket "
                                              << slot_owner_[slot] << ", not reduced yet");
        finish_bucket(slot_owner_[slot]);
      }
      bucket_pool_[slot].zero();
      slot_owner_[slot] = b;
    }
    return bucket_pool_[slot].data() + offsets_[p] - plan_.ranges[b].offset;
  }
  // ZeRO-2: once bucket b's reduce-scatter is done, its chunk / N into the gradient shard.
  void finish_bucket(int b) {
    if (ticket_[b] < 0) return;
    const int slot = slot_of(b);
    dc_->wait(ticket_[b]);
    float* chunk = bucket_pool_[slot].data() + r_ * shard_size_[b];
    gpu::scale(chunk, shard_size_[b], 1.0f / static_cast<float>(N_));
    copy_on_device(shard_grads_.data() + shard_offset_[b], chunk, shard_size_[b] * 4);
    ticket_[b] = -1;
    slot_owner_[slot] = -1;
  }

  // Sum over ranks of n elements at `offset` of the flat gradient, in place (04, 05).
  void all_reduce(int64_t offset, int64_t n, bool async = false) {
    float* g = trainer_->grads() + offset;
    if (plan_.ring) {
      ring_reduce_scatter(*dc_, dspan(g, n), scratch_.span().first(ceil_div(n, N_)),
                               DeviceAdd{});
      ring_all_gather(*dc_, dspan(g, n));
    } else if (async) {
      dc_->all_reduce_async(g, n);
    } else {
      dc_->all_reduce(g, n);
    }
  }

  // 06-07: reduce-scatters padded bucket b at `bucket` in place (chunk r becomes this rank's
  // shard of the sum); returns the ticket to wait for (the ring: done on return).
  int64_t reduce_scatter_bucket(float* bucket, int b) {
    check_in_step(b, 2);
    const int64_t s = shard_size_[b], P = s * N_;
    if (!plan_.ring) return dc_->reduce_scatter_async(bucket, bucket + r_ * s, s);  // in place
    ring_reduce_scatter(*dc_, dspan(bucket, P), scratch_.span().first(s), DeviceAdd{});
    return 0;
  }

  void central_step(float max_norm) {
    float* g = trainer_->grads();
    {  // chapter 03's reduce_to_rank0: ((g0 + g1) + g2) + ... on rank 0
      dc_->count_call("central_reduce");
      DeviceComm::Scope scope(*dc_, "central_reduce");
      if (r_ != 0) {
        dc_->send(g, psi_, 0);
      } else {
        for (int src = 1; src < N_; ++src) {
          dc_->recv(scratch_.data(), psi_, src);
          gpu::add(g, scratch_.data(), psi_);
        }
      }
    }
    if (r_ == 0) {
      gpu::scale(g, psi_, 1.0f / static_cast<float>(N_));
      clip({{g, psi_}}, max_norm, /*sum_over_ranks=*/false);
      optimizer_->update(trainer_->params(), g, 0, psi_);
    }
    dc_->count_call("central_broadcast");  // chapter 03's broadcast_from_rank0
    DeviceComm::Scope scope(*dc_, "central_broadcast");
    if (r_ == 0) {
      for (int dest = 1; dest < N_; ++dest) dc_->send(trainer_->params(), psi_, dest);
    } else {
      dc_->recv(trainer_->params(), psi_, 0);
    }
  }

  void zero12_step(float max_norm) {
    const auto& ranges = plan_.ranges;
    dc_->wait_async();  // every bucket's reduce-scatter (ZeRO-2: finished in end_backward)
    std::vector<std::pair<float*, int64_t>> shards;  // this rank's gradient shards
    for (size_t b = 0; b < ranges.size(); ++b) {
      float* shard;
      if (plan_.zero_stage == 1) {
        shard = trainer_->grads() + padded_offset_[b] + r_ * shard_size_[b];
        gpu::scale(shard, shard_size_[b], 1.0f / static_cast<float>(N_));
      } else {
        shard = shard_grads_.data() + shard_offset_[b];
      }
      shards.emplace_back(shard, shard_size_[b]);
    }
    clip(shards, max_norm, /*sum_over_ranks=*/true);
    for (size_t b = 0; b < ranges.size(); ++b) {  // padding stays 0: its g, m, v are 0
      float* p = trainer_->params() + padded_offset_[b] + r_ * shard_size_[b];
      optimizer_->update(p, shards[b].first, shard_offset_[b], shard_size_[b]);
    }
    for (size_t b = 0; b < ranges.size(); ++b) {
      float* bucket = trainer_->params() + padded_offset_[b];
      const int64_t s = shard_size_[b];
      if (plan_.ring)
        ring_all_gather(*dc_, dspan(bucket, s * N_));
      else
        dc_->all_gather_async(bucket + r_ * s, bucket, s);  // in place
    }
    dc_->wait_async();
  }

  // The collective check before collective `kind` of range `id` (bucket or layer): chapter 08's
  // desync check, always, counted as "desync_check" (its 16-byte header swap with each ring
  // neighbour, part of its traffic); chapters 05-07's --check-collectives, counted as "metrics".
  // Kinds: 0/1 a layer's forward/backward all-gather, 2 a reduce-scatter, 3 an all-reduce (a
  // bucket is checked once, before its first collective, as on the CPU).
  void check_in_step(int64_t id, uint32_t kind) {
    const bool zero3 = plan_.zero_stage == 3;
    if (!zero3 && !collective_checks_enabled()) return;
    const auto& range = plan_.ranges[id];
    const CollectiveHeader mine = {seq_++, static_cast<uint32_t>(id), kind,
                                   static_cast<uint32_t>(range.size + range.padding)};
    static const char* what[] = {"forward all-gather", "backward all-gather", "reduce-scatter",
                                 "all-reduce"};
    const char* unit = zero3 ? " of layer " : " of bucket ";
    check_collective(
        comm_, mine,
        [unit](const CollectiveHeader& h) {
          return "collective #" + std::to_string(h.seq) + " (" +
                 (h.kind < 4 ? what[h.kind] : "unknown") + unit + std::to_string(h.id) + ", " +
                 std::to_string(h.size) + " elements)";
        },
        "Every rank must run the same buckets and layers in the same order",
        zero3 ? "desync_check" : "metrics");
  }

  // ZeRO-3: gather i of the micro-step (gather_order_) into buffer i % 2, from every rank's shard
  // of its layer; the ring is done on return, NCCL's all-gather is queued (ticket).
  void post_gather(size_t i) {
    const auto [l, backward] = gather_order_[i];
    check_in_step(l, backward ? 1 : 0);
    const auto& layer = plan_.ranges[l];
    const int64_t s = (layer.size + layer.padding) / N_;
    float* full = gather_buf_[i % 2].data();
    const float* mine = shard_params_.data() + layer_shard_offset_[l];
    if (plan_.ring) {
      copy_on_device(full + r_ * s, mine, s * 4);
      ring_all_gather(*dc_, dspan(full, s * N_));
      gather_ticket_[i % 2] = 0;
    } else {
      gather_ticket_[i % 2] = dc_->all_gather_async(mine, full, s);
    }
    posted_gathers_ = i + 1;
  }

  // ZeRO-3: layer l's gradient (buffer l % 2) reduce-scattered in place; finished later.
  void post_layer_reduce(int64_t l) {
    check_in_step(l, 2);
    const auto& layer = plan_.ranges[l];
    const int64_t s = (layer.size + layer.padding) / N_;
    const int slot = static_cast<int>(l % 2);
    float* full = grad_buf_[slot].data();
    int64_t ticket = 0;
    if (plan_.ring)
      ring_reduce_scatter(*dc_, dspan(full, s * N_), scratch_.span().first(s), DeviceAdd{});
    else
      ticket = dc_->reduce_scatter_async(full, full + r_ * s, s);
    reduce_pending_[slot] = {l, ticket};
  }

  // ZeRO-3: once the reduce-scatter in grad buffer `slot` is done, its chunk / N into the shard.
  void finish_layer_reduce(int slot) {
    const auto [l, ticket] = reduce_pending_[slot];
    if (l < 0) return;
    dc_->wait(ticket);
    const auto& layer = plan_.ranges[l];
    const int64_t s = (layer.size + layer.padding) / N_;
    float* chunk = grad_buf_[slot].data() + r_ * s;
    gpu::scale(chunk, s, 1.0f / static_cast<float>(N_));
    gpu::add(shard_grads_.data() + layer_shard_offset_[l], chunk, s);
    reduce_pending_[slot] = {-1, 0};
  }

  void zero3_step(float max_norm) {
    clip({{shard_grads_.data(), shard_total_}}, max_norm, /*sum_over_ranks=*/true);
    optimizer_->update(shard_params_.data(), shard_grads_.data(), 0, shard_total_);
  }

  // clip_grad_norm_ over `parts` (device ranges); their Σ g² summed over ranks when sharded.
  void clip(const std::vector<std::pair<float*, int64_t>>& parts, float max_norm,
            bool sum_over_ranks) {
    if (max_norm <= 0) return;
    double local = 0.0;
    for (auto [g, n] : parts) local += gpu::sum_of_squares(g, n);
    double norm = std::sqrt(local);
    if (sum_over_ranks) {  // chapter 06's: one slot per rank, added in rank order on every rank
      std::vector<double> sums(static_cast<size_t>(N_), 0.0);
      sums[static_cast<size_t>(r_)] = local;
      norm = sum_in_rank_order(comm_, sums);
    }
    const float coef = clip_coefficient(norm, max_norm);
    if (coef < 1.0f)
      for (auto [g, n] : parts) gpu::scale(g, n, coef);
  }

  // ZeRO-3: the layer a host piece (this rank's shard of it) belongs to, and its real elements.
  int64_t layer_of_piece(const StatePiece& piece) const {
    for (size_t l = 0; l < plan_.ranges.size(); ++l) {
      const auto& layer = plan_.ranges[l];
      const int64_t s = (layer.size + layer.padding) / N_;
      if (piece.global_offset == layer.offset + r_ * s) return static_cast<int64_t>(l);
    }
    RZ_CHECK(false, "no ZeRO-3 layer has this rank's shard at " << piece.global_offset);
    return -1;
  }
  int64_t real_of_piece(int64_t l, const StatePiece& piece) const {
    const auto& layer = plan_.ranges[l];
    const int64_t s = (layer.size + layer.padding) / N_;
    const int64_t real = std::clamp<int64_t>(layer.size - r_ * s, 0, s);
    return std::min<int64_t>(real, static_cast<int64_t>(piece.params.size()));
  }

  Communicator& comm_;
  DevicePlan plan_;
  int N_, r_;
  std::string name_;
  std::unique_ptr<DeviceComm> dc_;
  std::unique_ptr<DeviceTrainer> trainer_;
  std::unique_ptr<DeviceOptimizer> optimizer_;
  int64_t psi_ = 0;
  std::vector<int64_t> sizes_, offsets_, numels_;
  DeviceBuffer scratch_;  // one incoming gradient (03) or ring chunk
  // buckets (05-07)
  std::vector<int> bucket_of_param_;
  std::vector<int64_t> params_per_range_, remaining_;
  bool last_micro_step_ = true;
  // ZeRO-1/2's padded layout (per range, plan order) and ZeRO-3's layer shards
  std::vector<int64_t> padded_offset_, padded_param_offsets_, shard_size_, shard_offset_;
  std::vector<int64_t> layer_shard_offset_;
  int64_t padded_total_ = 0, shard_total_ = 0, max_shard_ = 0;
  DeviceBuffer shard_params_, shard_grads_;  // ZeRO-2: shard_grads_; ZeRO-3: both
  std::vector<int64_t> ticket_;              // ZeRO-1/2: each bucket's reduce-scatter (-1: none)
  std::vector<DeviceBuffer> bucket_pool_;    // ZeRO-2: the buckets' memory
  std::vector<int> slot_owner_;              // ZeRO-2: the bucket in each pool slot (-1: free)
  // ZeRO-3: the micro-step's gathers in order, the two gather and two gradient buffers
  struct Gather {
    int64_t layer;
    bool backward;
  };
  std::vector<Gather> gather_order_;
  size_t next_gather_ = 0, posted_gathers_ = 0;
  DeviceBuffer gather_buf_[2], grad_buf_[2];
  int64_t gather_ticket_[2] = {0, 0};
  std::pair<int64_t, int64_t> reduce_pending_[2] = {{-1, 0}, {-1, 0}};  // (layer, ticket)
  uint32_t seq_ = 0;                         // collectives checked (check_in_step)
  // --trace
  DeviceClock clock_;
  Tracer* tracer_ = nullptr;
  double origin_us_ = 0;
  int layer_mark_ = -1;
  std::vector<DeviceSpan> compute_spans_;
};

}  // namespace

std::unique_ptr<DeviceParallel> make_device_parallel(const Model& model, const TrainConfig& config,
                                                     Communicator& comm, const DevicePlan& plan,
                                                     const TrainingState& state) {
  return std::make_unique<DeviceParallelImpl>(model, config, comm, plan, state);
}

}  // namespace ringzero
