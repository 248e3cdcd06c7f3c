// emulated_device: the device backend on the CPU (--device emulated), for machines without a GPU.
//
// Device memory is a memfd mapped twice: once PROT_NONE, the address every Buffer and Tensor on
// the device holds, so host code that reads or writes it directly (a loop a dispatch missed,
// an Eigen map, a printf of a weight) stops with SIGSEGV at that line, as a host dereference of
// a cudaMalloc pointer would fault; and once read-write, the "device side", which only this
// backend uses. Each operation translates its device addresses to that side and calls the very
// host function of common/core/ops.cpp or common/core/optim.cpp (the host addresses make its
// backend_of answer "host"), so an emulated run gives the CPU run's bits by construction. What it
// proves: every operation a chapter's train_step reaches goes through the backend table, and
// the bytes between host and device move where copy_memory says. What it cannot prove: CUDA's
// own results (scripts/gpu-check, on a GPU).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "common/core/check.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/half.hpp"
#include "common/core/ops.hpp"
#include "common/core/optim.hpp"

namespace ringzero {

namespace {

class EmulatedBackend : public DeviceBackend {
 public:
  std::string name() const override { return "emulated (host memory behind PROT_NONE)"; }

  void* allocate(int64_t bytes) override {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t length = (static_cast<size_t>(bytes) + page - 1) / page * page;
    const int fd = memfd_create("ringzero-emulated-device", MFD_CLOEXEC);
    RZ_CHECK(fd >= 0,
             "emulated device: no memfd for " << bytes << " bytes: " << std::strerror(errno));
    void* device = MAP_FAILED;
    void* side = MAP_FAILED;
    if (ftruncate(fd, static_cast<off_t>(length)) == 0) {
      device = mmap(nullptr, length, PROT_NONE, MAP_SHARED, fd, 0);
      side = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    const int error = errno;
    close(fd);
    if (device == MAP_FAILED || side == MAP_FAILED) {
      if (device != MAP_FAILED) munmap(device, length);
      if (side != MAP_FAILED) munmap(side, length);
      RZ_CHECK(false, "emulated device: cannot allocate " << bytes << " bytes: "
                                                          << std::strerror(error));
    }
    std::lock_guard lock(mutex_);
    maps_[reinterpret_cast<uintptr_t>(device)] = {static_cast<char*>(side), length};
    return device;  // zero-filled: a fresh memfd reads as zeros
  }
  void free(void* p) override {
    std::lock_guard lock(mutex_);
    auto it = maps_.find(reinterpret_cast<uintptr_t>(p));
    RZ_CHECK(it != maps_.end(), "emulated device: free of " << p << ", not an allocation");
    munmap(p, it->second.length);
    munmap(it->second.side, it->second.length);
    maps_.erase(it);
  }
  void copy(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(side(dst), side(src), static_cast<size_t>(bytes));
  }
  void zero(void* p, int64_t bytes) override {
    std::memset(side(p), 0, static_cast<size_t>(bytes));
  }

  void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override {
    ringzero::linear_forward(side(out), side(inp), side(weight), side(bias));
  }
  void linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) override {
    ringzero::linear_backward(side(dinp), side(dweight), side(dbias), side(dout), side(inp),
                              side(weight));
  }
  void relu_forward(const Tensor& out, const Tensor& inp) override {
    ringzero::relu_forward(side(out), side(inp));
  }
  void relu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& out) override {
    ringzero::relu_backward(side(dinp), side(dout), side(out));
  }
  float mse_forward(const Tensor& pred, const Tensor& target) override {
    return ringzero::mse_forward(side(pred), side(target));
  }
  void mse_backward(const Tensor& dpred, float dloss, const Tensor& pred,
                    const Tensor& target) override {
    ringzero::mse_backward(side(dpred), dloss, side(pred), side(target));
  }
  float cross_entropy_forward(const Tensor& probs, const Tensor& logits,
                              std::span<const int32_t> labels) override {
    return ringzero::cross_entropy_forward(side(probs), side(logits), labels);
  }
  void cross_entropy_backward(const Tensor& dlogits, float dloss, const Tensor& probs,
                              std::span<const int32_t> labels) override {
    ringzero::cross_entropy_backward(side(dlogits), dloss, side(probs), labels);
  }

  void adamw_update(float* p, float* m, float* v, const float* g, int64_t n,
                    const kernels::AdamWStep& k) override {
    ringzero::adamw_update(side(p), side(m), side(v), side(g), n, k);
  }
  void sgd_update(float* p, float* buf, const float* g, int64_t n, float lr, float momentum,
                  float weight_decay, bool first_step) override {
    ringzero::sgd_update(side(p), side(buf), side(g), n, lr, momentum, weight_decay, first_step);
  }
  double sum_of_squares(const float* g, int64_t n, float factor) override {
    return ringzero::sum_of_squares({side(g), static_cast<size_t>(n)}, factor);
  }
  void scale(float* g, int64_t n, float coef) override {
    ringzero::scale_in_place({side(g), static_cast<size_t>(n)}, coef);
  }
  void divide(float* g, int64_t n, float divisor) override {
    ringzero::divide_in_place({side(g), static_cast<size_t>(n)}, divisor);
  }
  void add(float* dst, const float* src, int64_t n) override {
    ringzero::add_into({side(dst), static_cast<size_t>(n)}, {side(src), static_cast<size_t>(n)});
  }
  void to_half(Dtype dtype, const float* in, uint16_t* out, int64_t n) override {
    ringzero::convert_to_half(dtype, {side(in), static_cast<size_t>(n)},
                              {side(out), static_cast<size_t>(n)});
  }
  void to_float(Dtype dtype, const uint16_t* in, float* out, int64_t n) override {
    ringzero::convert_to_float(dtype, {side(in), static_cast<size_t>(n)},
                               {side(out), static_cast<size_t>(n)});
  }
  double sum_of_squares_half(Dtype dtype, const uint16_t* g, int64_t n, float factor) override {
    return ringzero::sum_of_squares_half(dtype, {side(g), static_cast<size_t>(n)}, factor);
  }

 private:
  struct Mapping {
    char* side;
    size_t length;
  };
  // The device side of address p: p itself for a host address (and null).
  template <class T>
  T* side(T* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard lock(mutex_);
    auto it = maps_.upper_bound(a);
    if (p == nullptr || it == maps_.begin()) return p;
    --it;
    if (a >= it->first + it->second.length) return p;
    return reinterpret_cast<T*>(it->second.side + (a - it->first));
  }
  Tensor side(const Tensor& t) { return t.defined() ? Tensor(side(t.data()), t.shape()) : t; }

  std::mutex mutex_;
  std::map<uintptr_t, Mapping> maps_;  // device address -> its read-write side
};

}  // namespace

DeviceBackend& emulated_backend() {
  static EmulatedBackend backend;
  return backend;
}

}  // namespace ringzero
