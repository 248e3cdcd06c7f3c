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
// Leaves out: parameters outside Linear layers, mixed precision, CPU offload, prefetching more
// than one layer, keeping the last layer gathered from forward to backward (FSDP's root unit).
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chapters/06_zero1/sharded_clip.hpp"
#include "chapters/08_zero3/desync.hpp"
#include "chapters/08_zero3/layer_shard.hpp"
#include "chapters/08_zero3/unused_layers.hpp"
#include "common/checkpoint.hpp"
#include "common/collectives.hpp"
#include "common/comm_thread.hpp"
#include "common/dist.hpp"
#include "common/dist_eval.hpp"
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
        layout_(plan_layer_shards(model, comm.rank(), comm.world_size())),
        params_(layout_.shard_total, layout_.shard_total - layout_.shard_real, MemTag::parameters),
        grads_(layout_.shard_total, layout_.shard_total - layout_.shard_real, MemTag::gradients) {
    states_ = fp32_state_bytes(config.optimizer, config.momentum);  // K of --optimizer
    int64_t largest_chunk = 0;
    for (const LayerShard& s :
         layout_.layers) {  // this rank's real elements; its padding stays zero
      std::copy_n(model.params_memory.data() + s.offset + comm.rank() * s.shard_size, s.real,
                  params_.data() + s.shard_offset);
      optimizers_.emplace_back(config, s.segments);
      largest_chunk = std::max(largest_chunk, s.shard_size);
    }
    scratch_ = Buffer(largest_chunk, MemTag::comm_buffers);  // (max s_l) the ring's incoming chunk
    model.params_memory.release();                           // at rest: the shards only
    model.grads_memory.release();
    for (Parameter* p : model.parameters()) p->data = p->grad = Tensor();
    const int L = static_cast<int>(layout_.layers.size());
    gathered_.resize(L);
    full_grads_.resize(L);
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
  /// gradient shards (Σ s_l each, padding included), 8 per real element (AdamW) (zero_io.cpp).
  std::vector<int64_t> model_states_bytes() const;
  /// The most bytes of full layers (parameters and gradients) alive at once: comm_buffers,
  /// not model states, since they are the collectives' buffers (layer_shard.hpp, zero_io.cpp).
  int64_t in_flight_peak_bytes() const;
  /// The ledger's formula line: ZeRO-3's formula, the exact bytes of every rank, the layers in
  /// flight (zero_io.cpp).
  std::string ledger_formula() const;
  /// What every rank should send and receive per optimizer step (layer_shard.hpp, zero_io.cpp).
  TrafficTheory traffic_theory(int64_t grad_accum_steps) const;

  void zero_grad() { std::fill(grads_.data(), grads_.data() + grads_.size(), 0.0f); }

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
  double clip_grad_norm(float max_norm) {
    std::vector<std::span<float>> shards;  // (layers) this rank's real gradient elements
    for (const LayerShard& s : layout_.layers) shards.push_back(shard(grads_, s));
    return clip_sharded_grad_norm(comm_, shards, max_norm);  // sharded_clip.hpp
  }

  /// Every rank's optimizers update the real elements of its shards. No all-gather follows:
  /// the next forward gathers each layer when it needs it.
  void step() {
    for (size_t l = 0; l < layout_.layers.size(); ++l)
      optimizers_[l].step(shard(params_, layout_.layers[l]), shard(grads_, layout_.layers[l]));
  }

  /// Collective: evaluate_distributed (common/dist_eval.hpp) under ZeRO-3, every rank running as
  /// many forwards as the others (zero_io.cpp).
  EvalResult evaluate(const Dataset& test);

  /// Collective: a buffer laid out like the parameter shards, all-gathered one layer at a time
  /// and copied out as "<param><suffix>" with the parameter's shape (zero_io.cpp).
  std::map<std::string, NamedTensor> gather_full(
      const std::function<std::span<const float>(size_t)>& of, const std::string& suffix = "");
  /// Collective: the full parameters, named as state_dict() names them (for --save-final).
  std::map<std::string, NamedTensor> state_dict() {
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
  static std::span<float> shard(PaddedBuffer& buf, const LayerShard& s) {
    return buf.span().subspan(s.shard_offset, s.real);
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
    rs_ticket_ = post(l, kReduceScatter, full_grads_[l].data());
    if (!options_.prefetch || l == 0) finish_reduce_scatter();  // nothing left to overlap it with
  }

  // Waits for layer l's all-gather (posting it first unless prefetched) and points its
  // parameters at the gathered buffer.
  void use_gathered(int l, Kind kind) {
    // BEGIN EXERCISE 08.1 (ZeRO-3: gather a layer before it computes)
    if (!tickets_[l]) post_all_gather(l, kind);
    wait(tickets_[l], "wait all_gather " + name(l));
    const LayerShard& s = layout_.layers[l];
    s.layer->weight.data = Tensor(gathered_[l].data(), s.layer->weight.shape());
    s.layer->bias.data = Tensor(gathered_[l].data() + s.weight_numel, s.layer->bias.shape());
    // END EXERCISE 08.1
  }
  void post_all_gather(int l, Kind kind) {
    const LayerShard& s = layout_.layers[l];
    gathered_[l] = Buffer::uninitialized(
        s.padded_size, MemTag::comm_buffers);  // (P_l) the layer: all written by the gather
    std::copy_n(params_.data() + s.shard_offset, s.shard_size,
                gathered_[l].data() + comm_.rank() * s.shard_size);
    tickets_[l] = post(l, kind, gathered_[l].data());
  }
  void release_parameters(int l) {
    // BEGIN EXERCISE 08.1 (ZeRO-3: release a layer after it computed)
    gathered_[l].release();
    tickets_[l] = 0;
    layout_.layers[l].layer->weight.data = layout_.layers[l].layer->bias.data = Tensor();
    // END EXERCISE 08.1
  }
  void finish_reduce_scatter() {
    if (!rs_ticket_) return;
    wait(rs_ticket_, "wait reduce_scatter " + name(rs_layer_));
    full_grads_[rs_layer_].release();
    rs_ticket_ = 0;
  }

  // Queues layer l's collective on the communication thread, behind the desync check, and
  // returns its ticket. `full` (P_l): for an all-gather, this rank's chunk is in place; for the
  // reduce-scatter, the whole local gradient.
  uint64_t post(int l, Kind kind, float* full) {
    static const char* labels[] = {"all_gather %s (forward)", "all_gather %s (backward)",
                                   "reduce_scatter %s", "all_gather %s (state)"};
    char label[96];
    std::snprintf(label, sizeof label, labels[kind], name(l).c_str());
    const uint32_t seq = seq_++;
    Tracer* tracer = options_.tracer;
    if (tracer)
      tracer->instant(std::string("post ") + label, "zero3", Tracer::kMainTrack, {{"seq", seq}});
    return comm_thread_.submit([this, l, kind, seq, full, tracer, what = std::string(label)] {
      const double start = tracer ? tracer->now_us() : 0;
      check_in_step(comm_, layout_, seq, l, kind);  // desync.hpp
      const LayerShard& s = layout_.layers[l];
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
        const auto world_size = static_cast<float>(comm_.world_size());
        float* g = grads_.data() + s.shard_offset;
        for (int64_t i = 0; i < s.shard_size; ++i)
          g[i] += sum[i] / world_size;  // the mean, accumulated over micro-steps
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
  LayerLayout layout_;
  PaddedBuffer params_;  // (Σ s_l) this rank's shard of every layer's parameters
  PaddedBuffer grads_;   // (Σ s_l) and of their gradients, accumulated over micro-steps
  std::vector<Optimizer> optimizers_;  // (layers) each over this rank's real shard elements
  std::vector<Buffer> gathered_;       // (layers) a layer's full parameters (P_l) while gathered
  std::vector<Buffer>
      full_grads_;  // (layers) a layer's full gradient (P_l), backward to reduce-scatter
  std::vector<uint64_t> tickets_;  // (layers) the all-gather filling gathered_[l]; 0: not gathered
  UnusedLayers unused_layers_;     // which layers ran their backward in this step
  uint64_t rs_ticket_ = 0;         // the reduce-scatter in flight (at most one), of layer rs_layer_
  int rs_layer_ = -1;
  uint32_t seq_ = 0;  // collectives posted so far: the desync header's number
  double compute_start_ = 0;
  Buffer scratch_;
  std::shared_ptr<Zero3*> alive_ =
      std::make_shared<Zero3*>(this);  // what the layer hooks reach us by
  CommThread comm_thread_;  // last: destroyed (drained) first, while everything above lives
};

}  // namespace ringzero
