// tensor: float32, row-major, contiguous arrays and views into flat buffers.
//
// Provides: Tensor, a (pointer, shape) view that may also own its storage. A parameter, a
// gradient, a bucket and a shard are all views: (offset, size) into one flat Buffer, as in
// llm.c's params_memory. Eigen maps give the math without copies. A tensor lives where its
// memory does (device(): the host or a device, common/core/device_memory.hpp); mat(), vec(), span()
// and operator[] are for host tensors, the operations of common/core/ops.hpp take either.
// Leaves out: strides, broadcasting, dtypes other than float32.
#pragma once

#include <Eigen/Dense>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/core/ledger.hpp"

namespace ringzero {

using MatrixMap = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using ConstMatrixMap =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& shape);
std::string shape_str(const Shape& shape);  ///< "(64, 784)"

/// A row-major float32 array. Either a view (storage not owned; the owner outlives it) or
/// owning (storage shared by copies of this Tensor and freed with the last one).
class Tensor {
 public:
  Tensor() = default;
  /// A view of `shape` over data[0, numel(shape)).
  Tensor(float* data, Shape shape) : data_(data), shape_(std::move(shape)) {}
  /// A fresh zero-filled tensor on `device` whose bytes are counted under `tag`.
  static Tensor zeros(Shape shape, MemTag tag, Device device = Device::cpu);
  /// This tensor on `device`: itself when it is there already, else an owning copy counted
  /// under `tag` (PyTorch's Tensor.to).
  Tensor to(Device device, MemTag tag) const;
  /// Where the elements live.
  Device device() const { return device_of(data_); }

  float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return ringzero::numel(shape_); }
  int64_t rows() const { return shape_.size() == 1 ? 1 : shape_[0]; }
  int64_t cols() const { return shape_.back(); }
  bool defined() const { return data_ != nullptr || !shape_.empty(); }
  float& operator[](int64_t i) const { return data_[i]; }
  std::span<float> span() const { return {data_, static_cast<size_t>(numel())}; }

  /// The tensor as a (rows, cols) matrix; a 1-D tensor of n is (1, n).
  MatrixMap mat() const { return {data_, rows(), cols()}; }
  VectorMap vec() const { return {data_, numel()}; }

 private:
  float* data_ = nullptr;
  Shape shape_;
  std::shared_ptr<Buffer> storage_;  // set only for owning tensors
};

}  // namespace ringzero
