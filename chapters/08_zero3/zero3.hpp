// ZeRO-3 (Rajbhandari et al. 2020, §5.3, P_os+g+p; PyTorch's FSDP, DeepSpeed's stage 3): the
// parameters are sharded too. Each rank keeps only its shard of every Linear layer
// (layer_shard.hpp); a layer's full parameters exist only while it computes. Per layer and
// micro-step, on common/core/nn.hpp's module hooks:
//   pre-forward    all-gather the layer's parameters into a fresh buffer; point weight/bias at it
//   post-forward   free it
//   pre-backward   all-gather them again; allocate the layer's full gradient (zeros)
//   post-backward  free the parameters; reduce-scatter the gradient, add this rank's chunk / N
//                  to its gradient shard; free the gradient
// Model states (4 + 4 + 8)Ψ/N per rank at every moment; the layers in flight are comm_buffers.
// Prefetch: layer l+1's all-gather is posted while l runs forward (l−1's during backward).
// Each collective first swaps a 16-byte header with its ring neighbours (layer_collectives.hpp).
// What changed from chapter 07's zero.hpp (a new file, not a diff: the unit of sharding changed)
//   buckets (chapter 05's buckets.hpp) → layers (layer_shard.hpp), one shard per Linear layer
//   gradient-ready hooks               → module hooks: pre/post forward and backward per layer
//   reduce-scatter per bucket, no_sync → per layer and micro-step, into the gradient shard
//   all-gather after the step          → before each forward and backward, prefetched
//   full parameters on every rank      → a layer's, only while it computes
// Written once over T, the shards' and collectives' element type (--precision), and R, the
// gradient shard's (--reduce-dtype): common/precision/shard_precision.hpp. A layer computes in
// fp32 either way; in 16 bits, model states (2 + 2 + 12)Ψ/N (docs/mixed-precision.md).
// Leaves out: parameters outside Linear layers, CPU offload, prefetching more than one layer,
// keeping the last layer gathered from forward to backward (FSDP's root unit).
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "chapters/08_zero3/layer_collectives.hpp"
#include "chapters/08_zero3/layer_shard.hpp"
#include "chapters/08_zero3/options.hpp"
#include "common/checks/unused_parameters.hpp"
#include "common/comm/collectives.hpp"
#include "common/comm/typed_collectives.hpp"
#include "common/driver/engine_description.hpp"
#include "common/driver/train.hpp"
#include "common/precision/shard_precision.hpp"
#include "common/report/dist.hpp"
#include "common/zero/padded_buffer.hpp"

namespace ringzero {

/// ZeRO stage 3 (P_os+g+p, FSDP's FULL_SHARD) per Linear layer: every rank holds its shard of
/// every layer's parameters, gradients and optimizer state; a layer is gathered while it
/// computes. T, R: the shards' and the gradient shard's element types (above). Collective:
/// every rank calls its methods, and runs forwards, in the same order.
template <Element T = float, Element R = T>
class Zero3 {
 public:
  using Options = Zero3Options;  // options.hpp

  /// Cuts every layer of `model` into shards and keeps this rank's, builds this rank's optimizer
  /// over its real shard elements, one unit per layer (in 16 bits the fp32 master weights), frees
  /// the model's parameters and gradients (it runs only through its Zero3; num_parameters() still
  /// reads Ψ) and hooks every Linear. Errors: --collectives mpi in 16 bits.
  Zero3(Communicator& comm, Model& model, const TrainConfig& config, Options options)
      : comm_(comm),
        model_(model),
        options_(options),
        psi_(model.num_parameters()),
        grad_accum_steps_(config.grad_accum_steps),
        layout_(plan_layer_shards(model, comm.rank(), comm.world_size())),
        optimizer_(model, config, shard_pieces(layout_.buckets, comm.rank()), comm.world_size()) {
    optimizer_.check_types<T, R>();                                   // the flags' precision
    check_collectives_for<T>(options.collectives, config.precision);  // mpi: fp32 only
    const int64_t total = layout_.shard_total, padding = total - layout_.shard_real;
    params_ = PaddedBufferOf<T>(total, padding, MemTag::parameters, model.device());
    grads_ = PaddedBufferOf<R>(total, padding, MemTag::gradients, model.device());
    for (const BucketShard& s : layout_.buckets)  // this rank's real elements; padding stays 0
      if (s.real > 0)
        narrow_into(
            model.params_memory.span().subspan(s.offset + comm.rank() * s.shard_size, s.real),
            params_.span().subspan(s.shard_offset, s.real));
    for (Linear* m : layout_.layers) m->compute_dtype = dtype_of<T>();  // 16 bits: linear_half
    model.params_memory.release();                                      // at rest: the shards only
    model.grads_memory.release();
    for (Parameter* p : model.parameters()) p->data = p->grad = Tensor();
    const int L = static_cast<int>(layout_.layers.size());
    gathered_.resize(L);
    computing_.resize(L);
    full_grads_.resize(L);
    reducing_.resize(L);
    tickets_.assign(L, 0);
    for (Linear* m : layout_.layers)  // weight, bias: layer l's are 2l and 2l + 1
      for (Parameter* p : m->parameters()) layer_params_.push_back(p);
    received_.assign(layer_params_.size(), 0);
    for (int l = 0; l < L; ++l) {  // removed from the model with the Zero3 (hooks_)
      Linear& m = *layout_.layers[l];
      hooks_.pre_forward(m, [this, l](Module&) { pre_forward(l); });
      hooks_.post_forward(m, [this, l](Module&) { post_forward(l); });
      hooks_.pre_backward(m, [this, l](Module&) { pre_backward(l); });
      hooks_.post_backward(m, [this, l](Module&) { post_backward(l); });
    }
  }
  Zero3(const Zero3&) = delete;
  Zero3& operator=(const Zero3&) = delete;

  Communicator& comm() const { return comm_; }
  const LayerLayout& layout() const { return layout_; }

  /// Model-state bytes each rank holds, at every moment (zero_io.cpp).
  std::vector<int64_t> model_states_bytes() const;
  /// Bytes of full layers alive at the peak: comm_buffers, not model states (layer_shard.hpp).
  int64_t in_flight_peak_bytes() const {
    return ringzero::in_flight_peak_bytes(layout_, options_.prefetch, element_bytes<T>(),
                                          element_bytes<R>());
  }
  /// The ledger's line: ZeRO-3's formula, every rank's bytes, the layers in flight (zero_io.cpp).
  std::string ledger_formula() const;
  /// What this engine is, as data: stage 3, layers, collectives, prefetch, padding (zero_io.cpp).
  EngineDescription describe() const;
  /// What every rank should send and receive per optimizer step (layer_shard.hpp, zero_io.cpp;
  /// the text line is derived from describe(): common/driver/engine_lesson.hpp).
  TrafficTheory traffic_theory() const;
  /// This rank's optimizer: its shard's state, the loss scale, the backward seed.
  ShardOptimizer& optimizer() { return optimizer_; }
  const ShardOptimizer& optimizer() const { return optimizer_; }

  /// Sets this rank's gradient shard to zero.
  void zero_grad() { zero_elements(grads_.span()); }

  /// After the last micro-step's backward: waits for every reduce-scatter and releases a layer
  /// gathered ahead that then did not run (every rank posted that all-gather, the desync check
  /// makes sure: one more collective, not an error). A layer whose backward ran in no micro-step
  /// holds unused parameters (chapters 05-07, common/checks/unused_parameters.hpp): a zero
  /// gradient with find_unused_parameters, else every rank fails naming them.
  void finalize_backward() {
    finish_reduce_scatter();
    collectives_.wait_all();
    for (size_t l = 0; l < tickets_.size(); ++l)
      if (tickets_[l] != 0) release_parameters(static_cast<int>(l));  // prefetched, not run
    const std::string unused = unused_parameter_names(layer_params_, received_);
    std::fill(received_.begin(), received_.end(), 0);  // the next step starts anew
    check_unused_parameters(unused, options_.find_unused_parameters,
                            "Every rank would step them with a zero gradient without saying so");
  }

  /// Collective, after finalize_backward(): every rank's optimizer updates the real elements of
  /// its shards (clipped with --clip-grad-norm over every rank's shards first, as chapters
  /// 06-07). No all-gather follows: the next forward gathers each layer when it needs it.
  /// Returns false, on every rank, when fp16's loss scaler found an overflow on some rank.
  bool step() {
    std::vector<std::span<R>> grads;  // (layers) this rank's real gradient elements
    for (const BucketShard& s : layout_.buckets) grads.push_back(shard(grads_, s));
    if (!optimizer_.prepare(comm_, grads)) return false;  // fp16: an overflow on some rank
    for (size_t l = 0; l < layout_.layers.size(); ++l)
      optimizer_.step(l, shard(params_, layout_.buckets[l]), shard(grads_, layout_.buckets[l]));
    return true;
  }

  /// Collective: layer l's padded fp32 buffer (P_l) all-gathered, rank r's shard at r·s_l, for
  /// the states common/zero/shard_state.hpp gathers whole (--save-final, --save-optimizer-state).
  void gather_state(size_t l, std::span<float> layer);
  /// This rank's parameter and gradient shards, layer by layer (common/zero/shard_state.hpp).
  std::span<T> parameter_storage() { return params_.span(); }
  std::span<R> gradient_storage() { return grads_.span(); }

 private:
  template <class Padded>
  static std::span<typename Padded::T> shard(Padded& buf, const BucketShard& s) {
    return buf.span().subspan(s.shard_offset, s.real);
  }

  // The hooks (main thread). Linear l computes between its pre and post hooks.
  void pre_forward(int l) {
    use_gathered(l, kForwardGather);
    if (options_.prefetch && l + 1 < static_cast<int>(tickets_.size()) && !tickets_[l + 1])
      post_all_gather(l + 1, kForwardGather);  // moves while this layer computes
  }
  void post_forward(int l) { release_parameters(l); }
  void pre_backward(int l) {
    use_gathered(l, kBackwardGather);
    if (options_.prefetch && l > 0 && !tickets_[l - 1]) post_all_gather(l - 1, kBackwardGather);
    Linear& m = *layout_.layers[l];
    full_grads_[l] = Buffer(layout_.buckets[l].padded_size(), MemTag::comm_buffers,
                            model_.device());  // (P_l) zeros: backward accumulates here
    m.weight.grad = Tensor(full_grads_[l].data(), m.weight.shape());
    m.bias.grad = Tensor(full_grads_[l].data() + m.weight.numel(), m.bias.shape());
  }
  void post_backward(int l) {
    received_[2 * l] = received_[2 * l + 1] = 1;  // in any micro-step of the step
    release_parameters(l);
    layout_.layers[l]->weight.grad = layout_.layers[l]->bias.grad = Tensor();
    finish_reduce_scatter();  // the later layer's, posted one layer ago: usually done by now
    rs_layer_ = l;
    reducing_[l] = narrow_for_reduce<T, R>(full_grads_[l]);  // the gradient of T, in R
    const BucketShard& s = layout_.buckets[l];
    rs_ticket_ = collectives_.reduce_scatter(l, reducing_[l].span(),
                                             grads_.span().subspan(s.shard_offset, s.shard_size));
    if (!options_.prefetch || l == 0) finish_reduce_scatter();  // no prefetch, or nothing left
  }

  // Waits for layer l's all-gather (posting it first unless prefetched) and points its
  // parameters at the gathered buffer.
  void use_gathered(int l, LayerCollective kind) {
    // BEGIN EXERCISE 08.1 (ZeRO-3: gather a layer before it computes)
    if (!tickets_[l]) post_all_gather(l, kind);
    collectives_.wait(tickets_[l]);
    Linear& m = *layout_.layers[l];
    computing_[l] = widen_for_compute<T>(gathered_[l]);  // fp32: the same buffer; 16 bits: widened
    m.weight.data = Tensor(computing_[l].data(), m.weight.shape());
    m.bias.data = Tensor(computing_[l].data() + m.weight.numel(), m.bias.shape());
    // END EXERCISE 08.1
  }
  void post_all_gather(int l, LayerCollective kind) {
    const BucketShard& s = layout_.buckets[l];
    gathered_[l] = BufferOf<T>::uninitialized(  // (P_l) the layer: all written by the gather
        s.padded_size(), MemTag::comm_buffers, model_.device());
    copy_elements(params_.span().subspan(s.shard_offset, s.shard_size),
                  gathered_[l].span().subspan(comm_.rank() * s.shard_size, s.shard_size));
    tickets_[l] = collectives_.all_gather(l, kind, gathered_[l].span());
  }
  void release_parameters(int l) {
    // BEGIN EXERCISE 08.1 (ZeRO-3: release a layer after it computed)
    gathered_[l].release();  // 16 bits, or prefetched and not run (fp32: moved into computing_)
    computing_[l].release();
    tickets_[l] = 0;
    layout_.layers[l]->weight.data = layout_.layers[l]->bias.data = Tensor();
    // END EXERCISE 08.1
  }
  void finish_reduce_scatter() {
    if (!rs_ticket_) return;
    collectives_.wait(rs_ticket_);
    reducing_[rs_layer_].release();
    rs_ticket_ = 0;
  }

  Communicator& comm_;
  Model& model_;
  Options options_;
  int64_t psi_;
  int64_t grad_accum_steps_;  // K: every micro-step gathers every layer twice
  LayerLayout layout_;
  ShardOptimizer optimizer_;  // this rank's shard: --optimizer, or fp32 masters (16 bits)
  PaddedBufferOf<T> params_;  // (Σ s_l) this rank's shard of every layer's parameters
  PaddedBufferOf<R> grads_;   // (Σ s_l) and of their gradients, accumulated over micro-steps
  std::vector<BufferOf<T>> gathered_;  // (layers) a layer's full parameters (P_l) on the wire
  std::vector<Buffer> computing_;      // (layers) the same in fp32 while the layer computes
  std::vector<Buffer> full_grads_;     // (layers) a layer's full gradient (P_l), in backward
  std::vector<BufferOf<R>> reducing_;  // (layers) the same, of T in R, while reduce-scattered
  std::vector<uint64_t> tickets_;  // (layers) the all-gather filling gathered_[l]; 0: not gathered
  std::vector<Parameter*> layer_params_;  // (2L) every layer's weight and bias, layer order
  std::vector<char> received_;            // (2L) 1 once its layer's backward ran in this step
  uint64_t rs_ticket_ = 0;         // the reduce-scatter in flight (at most one), of layer rs_layer_
  int rs_layer_ = -1;
  ModuleHooks hooks_;  // the layers' hooks (common/core/nn.hpp)
  // Last: its communication thread drains first, while everything above lives.
  LayerCollectives<T, R> collectives_{comm_, layout_, options_.collectives, options_.tracer,
                                      model_.device()};
};

}  // namespace ringzero
