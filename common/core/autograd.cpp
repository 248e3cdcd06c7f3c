#include "common/core/autograd.hpp"

#include "common/core/check.hpp"
#include "common/core/step_time.hpp"

namespace ringzero {

Tensor& Node::grad_buffer() {
  if (!grad.defined()) grad = Tensor::zeros(value.shape(), MemTag::activations, value.device());
  return grad;
}

Var make_var(Tensor value, bool requires_grad) {
  auto v = std::make_shared<Node>();
  v->value = std::move(value);
  v->requires_grad = requires_grad;
  return v;
}

void Tape::record(std::function<void()> backward, std::vector<Parameter*> params) {
  for (Parameter* p : params) ++p->pending_uses_;
  entries_.push_back({std::move(backward), std::move(params)});
}

void Tape::clear() {
  for (Entry& e : entries_)
    for (Parameter* p : e.params) --p->pending_uses_;
  entries_.clear();
}

void Tape::backward(const Var& loss, float seed) {
  const PartScope part(StepPart::backward);  // --attribute: hooks' collectives are communication
  RZ_CHECK(loss && loss->value.numel() == 1, "backward() needs a scalar loss");
  RZ_CHECK(loss->requires_grad, "backward() on a loss that does not depend on any parameter");
  loss->grad_buffer()[0] += seed;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    it->backward();
    it->backward = nullptr;  // drops the captured activations now, not at the end
    for (Parameter* p : it->params) {
      if (--p->pending_uses_ == 0) {
        for (auto& hook : p->hooks_) hook(*p);
      }
    }
  }
  entries_.clear();
}

}  // namespace ringzero
