// ZeRO-3 (Rajbhandari et al. 2020, §5.3, P_os+g+p; PyTorch's FSDP, DeepSpeed's stage 3): the
// parameters are sharded too. Each rank keeps only its shard of every Linear layer
// (layer_shard.hpp); a layer's full parameters exist only while it computes. Per layer and
// micro-step, on common/nn.hpp's module hooks:
//   pre-forward    all-gather the layer's parameters into a fresh buffer; point weight/bias at it
//   post-forward   free it
//   pre-backward   all-gather them again; allocate the layer's full gradient (zeros)
//   post-backward  free the parameters; reduce-scatter the gradient, add this rank's chunk / N
//                  to its gradient shard; free the gradient
// Model states (4 + 4 + 8)Ψ/N per rank at every moment; the layers in flight are comm_buffers.
// Prefetch: layer l+1's all-gather is posted while l runs forward (l−1's during backward).
// Each collective first swaps a 16-byte header with its ring neighbours (desync.hpp).
// What changed from chapter 07's zero.hpp (a new file, not a diff: the unit of sharding changed)
//   buckets (buckets.hpp)              → layers (layer_shard.hpp), one shard per Linear layer
//   gradient-ready hooks               → module hooks: pre/post forward and backward per layer
//   reduce-scatter per bucket, no_sync → per layer and micro-step, into the gradient shard
//   all-gather after the step          → before each forward and backward, prefetched
//   full parameters on every rank      → a layer's, only while it computes
// In 16 bits (--precision bf16|fp16; docs/mixed-precision.md) the shards are 16-bit, each rank
// keeps fp32 master weights and AdamW's moments for its shard (MasterWeights), every collective
// moves 16-bit values (the gradient's reduce-scatter fp32 values with --reduce-dtype fp32), and a
// gathered layer is widened to fp32 for its compute:
// model states (2 + 2 + 12)Ψ/N (the ZeRO paper's §3.1 with K = 12).
// Leaves out: parameters outside Linear layers, CPU offload, prefetching more than one layer,
// keeping the last layer gathered from forward to backward (FSDP's root unit).
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/sharded_clip.hpp"
#include "chapters/08_zero3/desync.hpp"
#include "chapters/08_zero3/layer_shard.hpp"
#include "chapters/08_zero3/unused_layers.hpp"
#include "common/checkpoint.hpp"
#include "common/collectives.hpp"
#include "common/comm_thread.hpp"
#include "common/dist.hpp"
#include "common/dist_eval.hpp"
#include "common/mixed.hpp"
#include "common/optim.hpp"
#include "common/padded_buffer.hpp"
#include "common/safetensors.hpp"
#include "common/trace.hpp"
#include "common/train.hpp"
#include "common/zero_memory.hpp"

namespace ringzero {

/// ZeRO stage 3 (P_os+g+p, FSDP's FULL_SHARD) per Linear layer: every rank holds its shard of
/// every layer's parameters, gradients and optimizer state; a layer is gathered while it
/// computes. Collective: every rank calls its methods, and runs forwards, in the same order.
class Zero3 {
 public:
  struct Options {
    Collectives collectives =
        Collectives::ring;  ///< ring (chapter 04's) | mpi (MPI_Allgather, MPI_Reduce_scatter_block)
    bool prefetch = true;   ///< post the next layer's all-gather while this one computes
    /// A layer whose backward did not run in a step counts as a zero gradient, as chapter 05's
    /// find_unused_parameters; without it, finalize_backward() names its parameters and fails.
    bool find_unused_parameters = false;
    Tracer* tracer = nullptr;  ///< optional: posts, collectives, waits and each layer's compute
  };
  /// What a collective is for; part of the desync header.
  enum Kind : uint32_t { kForwardGather, kBackwardGather, kReduceScatter, kStateGather };

  /// Cuts every layer of `model` into shards and keeps this rank's, frees the model's full
  /// parameters and gradients (Model::num_parameters() still reads Ψ), builds this rank's
  /// optimizers (--optimizer of `config`, one per layer over its real shard elements) and hooks
  /// every Linear. The model keeps no parameters of its own: it runs only through its Zero3.
  Zero3(Communicator& comm, Model& model, const TrainConfig& config, Options options)
      : comm_(comm),
        model_(model),
        options_(options),
        psi_(model.num_parameters()),
        dtype_(zero3_dtype(config, options)),
        reduce_fp32_(dtype_ != Dtype::fp32 && config.reduce_dtype == "fp32"),
        layout_(plan_layer_shards(model, comm.rank(), comm.world_size())) {
    const int64_t total = layout_.shard_total, padding = total - layout_.shard_real;
    int64_t largest_chunk = 0;
    if (dtype_ == Dtype::fp32) {
      states_ = fp32_state_bytes(config.optimizer, config.momentum);  // K of --optimizer
      params_ = PaddedBuffer(total, padding, MemTag::parameters);
      grads_ = PaddedBuffer(total, padding, MemTag::gradients);
    } else {  // 16 bits: 16-bit shards, fp32 master weights (K = 12)
      states_ = kMixedPrecisionAdam;
      params16_ = PaddedBuffer16(total, padding, MemTag::parameters);
      grads16_ = PaddedBuffer16(total, padding, MemTag::gradients);
      if (dtype_ == Dtype::fp16) scaler_.emplace();  // GradScaler's defaults
    }
    for (const LayerShard& s :
         layout_.layers) {  // this rank's real elements; its padding stays zero
      std::span<const float> mine =
          model.params_memory.span().subspan(s.offset + comm.rank() * s.shard_size, s.real);
      if (dtype_ == Dtype::fp32) {
        std::copy(mine.begin(), mine.end(), params_.data() + s.shard_offset);
        optimizers_.emplace_back(config, s.segments);
      } else {
        convert_to_half(dtype_, mine, params16_.span().subspan(s.shard_offset, s.real));
        masters_.emplace_back(dtype_, mine, s.segments, adamw_options(config));
        s.layer->compute_dtype = dtype_;  // linear_half: 16-bit inputs, fp32 accumulation
      }
      largest_chunk = std::max(largest_chunk, s.shard_size);
    }
    if (dtype_ == Dtype::fp32 || reduce_fp32_)
      scratch_ = Buffer(largest_chunk, MemTag::comm_buffers);  // (max s_l) the ring's chunk
    else
      scratch16_ = Buffer16(largest_chunk, MemTag::comm_buffers);  // the same, 16-bit
    model.params_memory.release();                                 // at rest: the shards only
    model.grads_memory.release();
    for (Parameter* p : model.parameters()) p->data = p->grad = Tensor();
    const int L = static_cast<int>(layout_.layers.size());
    gathered_.resize(L);
    full_grads_.resize(L);
    gathered16_.resize(L);
    full_grads16_.resize(L);
    tickets_.assign(L, 0);
    unused_layers_ = UnusedLayers(L);
    for (int l = 0; l < L; ++l) {  // through alive_, so the hooks go quiet once the Zero3 is gone
      Linear& m = *layout_.layers[l].layer;
      m.add_pre_forward_hook([alive = alive_, l](Module&) {
        if (*alive) (*alive)->pre_forward(l);
      });
      m.add_post_forward_hook([alive = alive_, l](Module&) {
        if (*alive) (*alive)->post_forward(l);
      });
      m.add_pre_backward_hook([alive = alive_, l](Module&) {
        if (*alive) (*alive)->pre_backward(l);
      });
      m.add_post_backward_hook([alive = alive_, l](Module&) {
        if (*alive) (*alive)->post_backward(l);
      });
    }
  }
  ~Zero3() { *alive_ = nullptr; }
  Zero3(const Zero3&) = delete;
  Zero3& operator=(const Zero3&) = delete;

  const LayerLayout& layout() const { return layout_; }

  /// Model-state bytes each rank holds, at every moment: 4 per element of its parameter and
  /// gradient shards (Σ s_l each, padding included), 8 per real element (AdamW); in 16 bits
  /// 2 + 2 per shard element and 12 per real element (master weights, exp_avg, exp_avg_sq)
  /// (zero_io.cpp).
  std::vector<int64_t> model_states_bytes() const;
  /// The most bytes of full layers (parameters and gradients) alive at once: comm_buffers,
  /// not model states, since they are the collectives' buffers (layer_shard.hpp, zero_io.cpp).
  int64_t in_flight_peak_bytes() const;
  /// The ledger's formula line: ZeRO-3's formula, the exact bytes of every rank, the layers in
  /// flight (zero_io.cpp).
  std::string ledger_formula() const;
  /// What every rank should send and receive per optimizer step (layer_shard.hpp, zero_io.cpp).
  TrafficTheory traffic_theory(int64_t grad_accum_steps) const;
  /// Bytes per element of the parameters' all-gathers: 4 (fp32), or 2 in 16 bits.
  int64_t gather_bytes() const { return dtype_ == Dtype::fp32 ? 4 : 2; }
  /// Bytes per element of the gradient's reduce-scatter: 2 in 16 bits, else (fp32 or
  /// --reduce-dtype fp32) 4.
  int64_t reduce_bytes() const { return dtype_ == Dtype::fp32 || reduce_fp32_ ? 4 : 2; }
  Dtype dtype() const { return dtype_; }
  /// What backward's seed is multiplied by: 1/K in fp32 (the reduce-scatter divides by N);
  /// in 16 bits loss_scale/(N K), the mean taken BEFORE the 16-bit sum, as PyTorch's DDP
  /// Reducer divides each gradient by world_size before its all-reduce.
  float backward_seed(int64_t grad_accum_steps) const {
    if (dtype_ == Dtype::fp32) return 1.0f / static_cast<float>(grad_accum_steps);
    return (scaler_ ? scaler_->scale() : 1.0f) /
           static_cast<float>(grad_accum_steps * comm_.world_size());
  }

  void zero_grad() {
    std::fill(grads_.data(), grads_.data() + grads_.size(), 0.0f);
    std::fill(grads16_.data(), grads16_.data() + grads16_.size(), uint16_t{0});
    grad_factor_ = scaler_ ? scaler_->inv_scale() : 1.0f;  // 16 bits: what step() multiplies by
  }

  /// After the last micro-step's backward: every reduce-scatter has finished (the first
  /// layer's is waited for in its hook) and no layer is left gathered. A layer whose backward
  /// ran in no micro-step of this step is an unused one (unused_layers.hpp): a zero gradient
  /// with find_unused_parameters, else every rank fails naming its parameters. A layer gathered
  /// ahead (prefetch) that then did not run is released: every rank posted that all-gather (the
  /// desync check makes sure), so it is one more collective, not an error.
  void finalize_backward() {
    finish_reduce_scatter();
    comm_thread_.wait_all();
    for (size_t l = 0; l < tickets_.size(); ++l)
      if (tickets_[l] != 0) release_parameters(static_cast<int>(l));  // prefetched, not run
    unused_layers_.check(layout_, options_.find_unused_parameters);
  }

  /// Collective, after finalize_backward(): as chapters 06-07, each rank's Σ g² over its shard,
  /// summed in rank order on every rank; scales this rank's shard by clip_grad_norm_'s factor.
  /// In 16 bits the shards are not rescaled: the coefficient joins the factor step() applies
  /// to the widened gradient (with 1/loss scale in fp16), as chapter 01's MixedPrecision does.
  double clip_grad_norm(float max_norm) {
    if (dtype_ != Dtype::fp32) {
      std::vector<double> sums(static_cast<size_t>(comm_.world_size()), 0.0);  // (N) Σ g²
      for (const LayerShard& s : layout_.layers)
        sums[comm_.rank()] += sum_of_squares_half(dtype_, shard(grads16_, s), grad_factor_);
      const double norm = sum_in_rank_order(comm_, sums);  // sharded_clip.hpp
      grad_factor_ *= clip_coefficient(norm, max_norm);
      return norm;
    }
    std::vector<std::span<float>> shards;  // (layers) this rank's real gradient elements
    for (const LayerShard& s : layout_.layers) shards.push_back(shard(grads_, s));
    return clip_sharded_grad_norm(comm_, shards, max_norm);  // sharded_clip.hpp
  }

  /// Every rank's optimizers update the real elements of its shards. No all-gather follows:
  /// the next forward gathers each layer when it needs it. In 16 bits each layer's master
  /// weights take the widened gradient shard times the factor and write the rounded 16-bit
  /// shard; in fp16 a gradient that overflowed on any rank's shard skips the step on every
  /// rank (GradScaler), without advancing Adam's step counts. Returns whether it stepped.
  bool step() {
    if (dtype_ != Dtype::fp32) {
      if (scaler_ &&
          !scaler_->update(found_inf_on_any_rank(comm_, has_non_finite(dtype_, grads16_.span()))))
        return false;  // skipped on every rank: the decision was all-reduced
      for (size_t l = 0; l < layout_.layers.size(); ++l)
        masters_[l].step(shard(params16_, layout_.layers[l]), shard(grads16_, layout_.layers[l]),
                         grad_factor_);
      return true;
    }
    for (size_t l = 0; l < layout_.layers.size(); ++l)
      optimizers_[l].step(shard(params_, layout_.layers[l]), shard(grads_, layout_.layers[l]));
    return true;
  }
  /// In 16 bits: "precision", and in fp16 "loss_scale" and "skipped_steps" (summary record).
  nlohmann::json precision_summary() const {
    if (dtype_ == Dtype::fp32) return nlohmann::json::object();
    nlohmann::json j{{"precision", dtype_name(dtype_)}};
    if (scaler_) j["loss_scale"] = scaler_->scale(), j["skipped_steps"] = scaler_->skipped_steps();
    return j;
  }

  /// Collective: evaluate_distributed (common/dist_eval.hpp) under ZeRO-3, every rank running as
  /// many forwards as the others (zero_io.cpp).
  EvalResult evaluate(const Dataset& test);

  /// Collective: a buffer laid out like the parameter shards, all-gathered one layer at a time
  /// and copied out as "<param><suffix>" with the parameter's shape (zero_io.cpp).
  std::map<std::string, NamedTensor> gather_full(
      const std::function<std::span<const float>(size_t)>& of, const std::string& suffix = "");
  /// Collective: the full parameters, named as state_dict() names them (for --save-final).
  /// In 16 bits: the fp32 master weights (as chapter 01 saves them).
  std::map<std::string, NamedTensor> state_dict() {
    if (dtype_ != Dtype::fp32)
      return gather_full([this](size_t l) { return masters_[l].master(); });
    return gather_full(
        [this](size_t l) { return std::span<const float>(shard(params_, layout_.layers[l])); });
  }
  /// Collective: AdamW's state, named as chapters 06-07 name it (zero_io.cpp).
  std::map<std::string, NamedTensor> optimizer_state_dict();
  /// The training state as common/checkpoint.hpp saves and loads it: one piece per layer
  /// (this rank's real shard elements and their optimizer) at its global offset (zero_io.cpp).
  TrainingState training_state();

  /// Elements of the padding of the parameter and gradient shards that are not zero (must be 0).
  int64_t nonzero_padding() const;

 private:
  template <class Padded>
  static std::span<typename Padded::T> shard(Padded& buf, const LayerShard& s) {
    return buf.span().subspan(s.shard_offset, s.real);
  }
  static Dtype zero3_dtype(const TrainConfig& config, const Options& options) {
    const Dtype d = parse_dtype(config.precision, "--precision");
    RZ_CHECK(d == Dtype::fp32 || options.collectives == Collectives::ring,
             "--precision " << config.precision << " with --collectives mpi: MPI has no "
                            << config.precision << " sum. Use --collectives ring (ours, 16-bit) "
                            << "or --precision fp32");
    return d;  // --reduce-dtype: checked once, before any chapter is built (common/run.cpp)
  }
  std::string name(int l) const { return layout_.layers[l].layer->name(); }

  // The hooks (main thread). Linear l computes between its pre and post hooks.
  void pre_forward(int l) {
    use_gathered(l, kForwardGather);
    if (options_.prefetch && l + 1 < static_cast<int>(tickets_.size()) && !tickets_[l + 1])
      post_all_gather(l + 1, kForwardGather);  // moves while this layer computes
    compute_start_ = now();
  }
  void post_forward(int l) {
    trace_compute("forward " + name(l), "forward");
    release_parameters(l);
  }
  void pre_backward(int l) {
    use_gathered(l, kBackwardGather);
    if (options_.prefetch && l > 0 && !tickets_[l - 1]) post_all_gather(l - 1, kBackwardGather);
    const LayerShard& s = layout_.layers[l];
    full_grads_[l] =
        Buffer(s.padded_size, MemTag::comm_buffers);  // (P_l) zeros: backward accumulates here
    s.layer->weight.grad = Tensor(full_grads_[l].data(), s.layer->weight.shape());
    s.layer->bias.grad = Tensor(full_grads_[l].data() + s.weight_numel, s.layer->bias.shape());
    compute_start_ = now();
  }
  void post_backward(int l) {
    unused_layers_.ran_backward(l);
    trace_compute("backward " + name(l), "backward");
    release_parameters(l);
    layout_.layers[l].layer->weight.grad = layout_.layers[l].layer->bias.grad = Tensor();
    finish_reduce_scatter();  // the later layer's, posted one layer ago: usually done by now
    rs_layer_ = l;
    if (reduce_fp32_) {  // the 16-bit gradient, kept in fp32 to be summed in fp32
      round_in_place(dtype_, full_grads_[l].span());
    } else if (dtype_ != Dtype::fp32) {  // the 16-bit gradient backward writes: rounded once
      full_grads16_[l] = Buffer16::uninitialized(full_grads_[l].size(), MemTag::comm_buffers);
      convert_to_half(dtype_, full_grads_[l].span(), full_grads16_[l].span());
      full_grads_[l].release();
    }
    rs_ticket_ = post(l, kReduceScatter, full_grads_[l].data(), full_grads16_[l].data());
    if (!options_.prefetch || l == 0) finish_reduce_scatter();  // nothing left to overlap it with
  }

  // Waits for layer l's all-gather (posting it first unless prefetched) and points its
  // parameters at the gathered buffer.
  void use_gathered(int l, Kind kind) {
    // BEGIN EXERCISE 08.1 (ZeRO-3: gather a layer before it computes)
    if (!tickets_[l]) post_all_gather(l, kind);
    wait(tickets_[l], "wait all_gather " + name(l));
    const LayerShard& s = layout_.layers[l];
    if (dtype_ != Dtype::fp32) {  // 16 bits: the layer widened to fp32 for its compute
      gathered_[l] = Buffer::uninitialized(s.padded_size, MemTag::comm_buffers);
      convert_to_float(dtype_, gathered16_[l].span(), gathered_[l].span());
      gathered16_[l].release();
    }
    s.layer->weight.data = Tensor(gathered_[l].data(), s.layer->weight.shape());
    s.layer->bias.data = Tensor(gathered_[l].data() + s.weight_numel, s.layer->bias.shape());
    // END EXERCISE 08.1
  }
  void post_all_gather(int l, Kind kind) {
    const LayerShard& s = layout_.layers[l];
    if (dtype_ != Dtype::fp32) {  // 16 bits: the 16-bit layer moves (use_gathered widens it)
      gathered16_[l] = Buffer16::uninitialized(s.padded_size, MemTag::comm_buffers);
      std::copy_n(params16_.data() + s.shard_offset, s.shard_size,
                  gathered16_[l].data() + comm_.rank() * s.shard_size);
      tickets_[l] = post(l, kind, nullptr, gathered16_[l].data());
      return;
    }
    gathered_[l] = Buffer::uninitialized(
        s.padded_size, MemTag::comm_buffers);  // (P_l) the layer: all written by the gather
    std::copy_n(params_.data() + s.shard_offset, s.shard_size,
                gathered_[l].data() + comm_.rank() * s.shard_size);
    tickets_[l] = post(l, kind, gathered_[l].data());
  }
  void release_parameters(int l) {
    // BEGIN EXERCISE 08.1 (ZeRO-3: release a layer after it computed)
    gathered_[l].release();
    gathered16_[l].release();  // 16 bits: a prefetched layer that did not run
    tickets_[l] = 0;
    layout_.layers[l].layer->weight.data = layout_.layers[l].layer->bias.data = Tensor();
    // END EXERCISE 08.1
  }
  void finish_reduce_scatter() {
    if (!rs_ticket_) return;
    wait(rs_ticket_, "wait reduce_scatter " + name(rs_layer_));
    full_grads_[rs_layer_].release();
    full_grads16_[rs_layer_].release();
    rs_ticket_ = 0;
  }

  // Queues layer l's collective on the communication thread, behind the desync check, and
  // returns its ticket. `full` (P_l): for an all-gather, this rank's chunk is in place; for the
  // reduce-scatter, the whole local gradient. In 16 bits `full16` holds them instead (except
  // for kStateGather, which gathers fp32 state).
  uint64_t post(int l, Kind kind, float* full, uint16_t* full16 = nullptr) {
    static const char* labels[] = {"all_gather %s (forward)", "all_gather %s (backward)",
                                   "reduce_scatter %s", "all_gather %s (state)"};
    char label[96];
    std::snprintf(label, sizeof label, labels[kind], name(l).c_str());
    const uint32_t seq = seq_++;
    Tracer* tracer = options_.tracer;
    if (tracer)
      tracer->instant(std::string("post ") + label, "zero3", Tracer::kMainTrack, {{"seq", seq}});
    return comm_thread_.submit(
        [this, l, kind, seq, full, full16, tracer, what = std::string(label)] {
          const double start = tracer ? tracer->now_us() : 0;
          check_in_step(comm_, layout_, seq, l, kind);  // desync.hpp
          const LayerShard& s = layout_.layers[l];
          if (full16 != nullptr) {  // 16 bits: chapter 04's 16-bit ring, no division (pre-divided)
            std::span<uint16_t> layer16(full16, static_cast<size_t>(s.padded_size));
            if (kind == kReduceScatter) {
              ring_reduce_scatter(comm_, layer16, dtype_, scratch16_.span());
              accumulate_half(dtype_, grads16_.span().subspan(s.shard_offset, s.shard_size),
                              layer16.subspan(comm_.rank() * s.shard_size, s.shard_size));
            } else {
              ring_all_gather(comm_, layer16);
            }
            if (tracer)
              tracer->complete(what, "comm", Tracer::kCommTrack, start, tracer->now_us() - start,
                               {{"seq", seq}, {"bytes", 2 * s.padded_size}});
            return;
          }
          std::span<float> layer(full, static_cast<size_t>(s.padded_size));
          std::span<float> mine = layer.subspan(comm_.rank() * s.shard_size, s.shard_size),
                           chunk = scratch_.span().first(s.shard_size);
          const bool ring = options_.collectives == Collectives::ring;
          if (kind == kReduceScatter) {
            if (ring)
              ring_reduce_scatter(comm_, layer,
                                  scratch_.span());  // chapter 04's first half: mine holds Σ
            else
              comm_.reduce_scatter(layer, chunk);  // MPI wants the output apart
            std::span<const float> sum = ring ? mine : chunk;
            if (reduce_fp32_) {  // 16-bit shard, fp32 sum (pre-divided): one rounding
              accumulate_half(dtype_, grads16_.span().subspan(s.shard_offset, s.shard_size), sum);
            } else {
              const auto world_size = static_cast<float>(comm_.world_size());
              float* g = grads_.data() + s.shard_offset;
              for (int64_t i = 0; i < s.shard_size; ++i)
                g[i] += sum[i] / world_size;  // the mean, accumulated over micro-steps
            }
          } else if (ring) {
            ring_all_gather(comm_, layer);  // chapter 04's second half
          } else {                          // MPI wants the input apart
            std::copy(mine.begin(), mine.end(), chunk.begin());
            comm_.all_gather(chunk, layer);
          }
          if (tracer)
            tracer->complete(what, "comm", Tracer::kCommTrack, start, tracer->now_us() - start,
                             {{"seq", seq}, {"bytes", 4 * s.padded_size}});
        });
  }

  void wait(uint64_t ticket, const std::string& label) {
    const double start = now();
    comm_thread_.wait(ticket);
    if (options_.tracer)
      options_.tracer->complete(label, "wait", Tracer::kMainTrack, start, now() - start);
  }
  double now() const { return options_.tracer ? options_.tracer->now_us() : 0; }
  void trace_compute(const std::string& label, const char* cat) {
    if (options_.tracer)
      options_.tracer->complete(label, cat, Tracer::kMainTrack, compute_start_,
                                now() - compute_start_);
  }

  Communicator& comm_;
  Model& model_;
  Options options_;
  int64_t psi_;
  StateBytes states_ = kFp32Adam;  // bytes per parameter: p, g, K (--optimizer)
  Dtype dtype_;                    // --precision: fp32, or 16-bit shards with fp32 master weights
  bool reduce_fp32_;  // 16 bits with --reduce-dtype fp32: the reduce-scatter moves fp32
  LayerLayout layout_;
  PaddedBuffer params_;  // (Σ s_l) this rank's shard of every layer's parameters (fp32)
  PaddedBuffer grads_;   // (Σ s_l) and of their gradients, accumulated over micro-steps
  PaddedBuffer16 params16_, grads16_;   // (Σ s_l) the same in 16 bits (else empty)
  std::vector<MasterWeights> masters_;  // (layers) 16 bits: fp32 master + AdamW moments
  std::optional<GradScaler> scaler_;    // fp16: dynamic loss scaling
  float grad_factor_ = 1.0f;            // 16 bits: 1/loss scale × clip coefficient
  std::vector<Optimizer> optimizers_;   // (layers) each over this rank's real shard elements
  std::vector<Buffer> gathered_;        // (layers) a layer's full parameters (P_l) while gathered
  std::vector<Buffer>
      full_grads_;  // (layers) a layer's full gradient (P_l), backward to reduce-scatter
  std::vector<Buffer16> gathered16_, full_grads16_;  // (layers) 16 bits: a layer on the wire
  std::vector<uint64_t> tickets_;  // (layers) the all-gather filling gathered_[l]; 0: not gathered
  UnusedLayers unused_layers_;     // which layers ran their backward in this step
  uint64_t rs_ticket_ = 0;         // the reduce-scatter in flight (at most one), of layer rs_layer_
  int rs_layer_ = -1;
  uint32_t seq_ = 0;  // collectives posted so far: the desync header's number
  double compute_start_ = 0;
  Buffer scratch_;
  Buffer16 scratch16_;  // 16 bits: the ring's incoming chunk
  std::shared_ptr<Zero3*> alive_ =
      std::make_shared<Zero3*>(this);  // what the layer hooks reach us by
  CommThread comm_thread_;  // last: destroyed (drained) first, while everything above lives
};

}  // namespace ringzero
