// Helpers shared by the unit tests: owned tensors filled with given or random values, a
// parameter with its own storage, central differences in double, and a temporary directory.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <initializer_list>
#include <string>
#include <unistd.h>

#include "common/core/autograd.hpp"
#include "common/core/rng.hpp"

namespace ringzero::test {

/// The whole content of the file at `path` ("" if it cannot be read).
inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A fresh tensor holding `values` (row-major), counted as activations.
inline Tensor tensor(Shape shape, std::initializer_list<float> values) {
  Tensor t = Tensor::zeros(std::move(shape), MemTag::activations);
  int64_t i = 0;
  for (float v : values) t[i++] = v;
  return t;
}

/// A fresh tensor of standard-normal values from (seed, stream).
inline Tensor randn(Shape shape, uint64_t seed, uint64_t stream = 0) {
  Tensor t = Tensor::zeros(std::move(shape), MemTag::activations);
  Rng rng(seed, stream);
  for (float& v : t.span()) v = rng.normal();
  return t;
}

/// A Parameter whose data and grad are owned by this object (a Model would own them in its
/// flat buffers); grad starts at zero.
struct OwnedParameter {
  OwnedParameter(const std::string& name, Tensor values) : p(name, values.shape()), data(values) {
    grad = Tensor::zeros(values.shape(), MemTag::gradients);
    p.data = data;
    p.grad = grad;
  }
  Parameter p;
  Tensor data, grad;
};

/// d f / d x at x's current value by central differences, in double:
///   (f(x + h) - f(x - h)) / (x+ - x-)
/// where x+ and x- are the float32 values actually stored (so the rounding of x ± h to float
/// does not enter the error). x is restored afterwards.
inline double central_difference(const std::function<double()>& f, float& x, float h) {
  const float x0 = x;
  x = x0 + h;
  const float xp = x;
  const double fp = f();
  x = x0 - h;
  const float xm = x;
  const double fm = f();
  x = x0;
  return (fp - fm) / (static_cast<double>(xp) - static_cast<double>(xm));
}

/// A fresh, empty directory under the system temp dir, removed by the destructor.
struct TempDir {
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("ringzero_unit_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::filesystem::path path;
};

}  // namespace ringzero::test
