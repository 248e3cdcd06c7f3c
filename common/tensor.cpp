#include "tensor.hpp"

#include "check.hpp"

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

Tensor Tensor::zeros(Shape shape, MemTag tag) {
  for (int64_t d : shape) RZ_CHECK(d >= 0, "negative dimension in shape " << shape_str(shape));
  auto storage = std::make_shared<Buffer>(ringzero::numel(shape), tag);
  Tensor t(storage->data(), std::move(shape));
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  RZ_CHECK(
      !shape_.empty() && 0 <= begin && begin <= end && end <= shape_[0],
      "row slice [" << begin << ", " << end << ") out of range for shape " << shape_str(shape_));
  const int64_t row_size = shape_[0] == 0 ? 0 : numel() / shape_[0];
  Shape s = shape_;
  s[0] = end - begin;
  Tensor t(data_ + begin * row_size, std::move(s));
  t.storage_ = storage_;
  return t;
}

}  // namespace ringzero
