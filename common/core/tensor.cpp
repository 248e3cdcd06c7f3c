#include "common/core/tensor.hpp"

#include "common/core/check.hpp"

namespace ringzero {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

Tensor Tensor::zeros(Shape shape, MemTag tag, Device device) {
  for (int64_t d : shape) RZ_CHECK(d >= 0, "negative dimension in shape " << shape_str(shape));
  auto storage = std::make_shared<Buffer>(ringzero::numel(shape), tag, device);
  Tensor t(storage->data(), std::move(shape));
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::to(Device device, MemTag tag) const {
  if (!defined() || this->device() == device) return *this;
  Tensor t = zeros(shape_, tag, device);
  copy_memory(t.data(), data_, numel() * static_cast<int64_t>(sizeof(float)));
  return t;
}

}  // namespace ringzero
