#include "data.hpp"

#include <zlib.h>

#include <filesystem>
#include <numeric>

#include "check.hpp"
#include "rng.hpp"

namespace ringzero {

IdxArray read_idx_gz(const std::string& path, int expected_ndim) {
  RZ_CHECK(std::filesystem::exists(path),
           "dataset file " << path
                           << " not found; install Fashion-MNIST with "
                              "scripts/setup (Debian package dataset-fashion-mnist) "
                              "or pass --data-dir DIR");
  gzFile f = gzopen(path.c_str(), "rb");
  RZ_CHECK(f != nullptr, "cannot open " << path);
  auto read_exact = [&](void* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      int r = gzread(f, static_cast<char*>(dst) + got,
                     static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30)));
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  };
  auto fail_file = [&](const std::string& what) {
    gzclose(f);
    RZ_CHECK(false, path << ": " << what
                         << "; the file is corrupt, reinstall it with "
                            "`apt-get install --reinstall dataset-fashion-mnist`");
  };
  uint8_t header[4];
  if (read_exact(header, 4) != 4) fail_file("shorter than the 4-byte IDX magic number");
  // Magic: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
  if (header[0] != 0 || header[1] != 0 || header[2] != 0x08 || header[3] != expected_ndim) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "bad magic 0x%02x%02x%02x%02x, expected 0x000008%02x", header[0],
                  header[1], header[2], header[3], expected_ndim);
    fail_file(buf);
  }
  IdxArray arr;
  int64_t total = 1;
  for (int d = 0; d < expected_ndim; ++d) {
    uint8_t b[4];
    if (read_exact(b, 4) != 4) fail_file("truncated in the dimension sizes");
    const int64_t dim = (int64_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
    arr.dims.push_back(dim);
    total *= dim;
  }
  arr.data.resize(static_cast<size_t>(total));
  const size_t got = read_exact(arr.data.data(), arr.data.size());
  if (got != arr.data.size())
    fail_file("truncated: " + std::to_string(got) + " of " + std::to_string(total) +
              " data bytes present");
  uint8_t extra;
  if (read_exact(&extra, 1) != 0)
    fail_file("trailing bytes after " + std::to_string(total) + " data bytes");
  int errnum = 0;
  gzerror(f, &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) fail_file("gzip stream error");
  gzclose(f);
  return arr;
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  RZ_CHECK(std::filesystem::is_directory(dir),
           "Fashion-MNIST directory " << dir
                                      << " not found; run scripts/setup "
                                         "(installs dataset-fashion-mnist) or pass --data-dir DIR");
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  IdxArray images = read_idx_gz(prefix + "-images-idx3-ubyte.gz", 3);
  IdxArray labels = read_idx_gz(prefix + "-labels-idx1-ubyte.gz", 1);
  RZ_CHECK(images.dims[1] == 28 && images.dims[2] == 28,
           prefix << "-images-idx3-ubyte.gz: images are " << images.dims[1] << "x" << images.dims[2]
                  << ", expected 28x28");
  RZ_CHECK(images.dims[0] == labels.dims[0],
           prefix << ": " << images.dims[0] << " images but " << labels.dims[0]
                  << " labels; the two files must come from the same split");
  Dataset ds;
  ds.size = images.dims[0];
  ds.in_features = 28 * 28;
  ds.num_classes = ds.out_features = 10;
  ds.inputs = Buffer(ds.size * ds.in_features, MemTag::dataset);
  for (size_t i = 0; i < images.data.size(); ++i)
    ds.inputs.data()[i] = static_cast<float>(images.data[i]) / 255.0f;
  ds.labels.resize(static_cast<size_t>(ds.size));
  for (int64_t i = 0; i < ds.size; ++i) {
    RZ_CHECK(labels.data[i] < 10, prefix << "-labels-idx1-ubyte.gz: label " << int{labels.data[i]}
                                         << " at index " << i << " is outside 0..9");
    ds.labels[i] = labels.data[i];
  }
  return ds;
}

Dataset make_synthetic(int64_t n, int64_t in_features, int64_t out_features, uint64_t seed,
                       uint64_t stream) {
  Dataset ds;
  ds.size = n;
  ds.in_features = in_features;
  ds.out_features = out_features;
  ds.inputs = Buffer(n * in_features, MemTag::dataset);
  ds.targets = Buffer(n * out_features, MemTag::dataset);
  Rng rng(seed, stream);
  for (float& v : ds.inputs.span()) v = rng.normal();
  for (float& v : ds.targets.span()) v = rng.normal();
  return ds;
}

void Dataset::gather(std::span<const int64_t> indices, Tensor x, Tensor y,
                     std::vector<int32_t>& batch_labels) const {
  batch_labels.clear();
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t s = indices[i];
    std::copy_n(inputs.data() + s * in_features, in_features, x.data() + i * in_features);
    if (classification())
      batch_labels.push_back(labels[s]);
    else
      std::copy_n(targets.data() + s * out_features, out_features, y.data() + i * out_features);
  }
}

Sampler::Sampler(int64_t dataset_size, int64_t global_batch_size, uint64_t seed, bool shuffle)
    : dataset_size_(dataset_size),
      global_batch_size_(global_batch_size),
      seed_(seed),
      shuffle_(shuffle) {
  RZ_CHECK(global_batch_size > 0,
           "--global-batch-size " << global_batch_size << " must be positive");
  RZ_CHECK(global_batch_size <= dataset_size,
           "--global-batch-size " << global_batch_size << " exceeds the " << dataset_size
                                  << " training samples; use a smaller batch");
  set_epoch(0);
}

void Sampler::set_epoch(int64_t epoch) {
  order_.resize(static_cast<size_t>(dataset_size_));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (!shuffle_) return;
  Rng rng(seed_, 0x5348554646ull + static_cast<uint64_t>(epoch));  // stream "SHUFF" + epoch
  for (int64_t i = dataset_size_ - 1; i > 0; --i)
    std::swap(order_[i], order_[rng.below(static_cast<uint64_t>(i) + 1)]);
}

std::span<const int64_t> Sampler::global_batch(int64_t step) const {
  RZ_CHECK(step >= 0 && step < steps_per_epoch(),
           "step " << step << " outside [0, " << steps_per_epoch() << ")");
  return {order_.data() + step * global_batch_size_, static_cast<size_t>(global_batch_size_)};
}

std::span<const int64_t> Sampler::chunk(int64_t step, int64_t chunk, int64_t num_chunks) const {
  RZ_CHECK(
      num_chunks > 0 && global_batch_size_ % num_chunks == 0 && chunk >= 0 && chunk < num_chunks,
      "global batch " << global_batch_size_ << " cannot be cut into " << num_chunks
                      << " equal chunks");
  const int64_t size = global_batch_size_ / num_chunks;
  return global_batch(step).subspan(static_cast<size_t>(chunk * size), static_cast<size_t>(size));
}

}  // namespace ringzero
