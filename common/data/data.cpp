#include "common/data/data.hpp"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "common/core/check.hpp"
#include "common/core/checked.hpp"
#include "common/core/rng.hpp"
#include "common/io/atomic_file.hpp"

namespace ringzero {

IdxArray read_idx_gz(const std::string& path, int expected_ndim) {
  RZ_CHECK(!file_kind(path).empty(),
           "dataset file " << path
                           << " not found; give --data-dir a directory that holds the four "
                              "Fashion-MNIST .gz files (scripts/setup installs Debian's "
                              "dataset-fashion-mnist in the default, "
                           << kFashionMnistDir << ")");
  // A FIFO would block the read forever; a directory fails with a misleading message.
  check_input_file("dataset file", path,
                   "give --data-dir a directory holding the four Fashion-MNIST .gz files");
  std::ifstream in(path, std::ios::binary);
  RZ_CHECK(in, "cannot open " << path);
  const std::vector<uint8_t> gz((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  RZ_CHECK(!in.bad(), "reading " << path << " failed");
  return decode_idx_gz(gz, path, expected_ndim);
}

namespace {

// Inflates a gzip file (one or more members) held in memory, on demand, checking every
// member's CRC-32 and length trailer (zlib does) and refusing bytes after the last member.
class GzipReader {
 public:
  explicit GzipReader(std::span<const uint8_t> gz) {
    zs_.next_in = const_cast<Bytef*>(gz.data());  // zlib's API is not const-correct
    zs_.avail_in = static_cast<uInt>(std::min<size_t>(gz.size(), UINT32_MAX));
    rest_ = gz.size() - zs_.avail_in;
    if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) error_ = "zlib could not start";
  }
  ~GzipReader() { inflateEnd(&zs_); }
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  /// Up to n decoded bytes into dst; fewer only at the end of the data or on an error().
  size_t read(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n && !ended_ && error_.empty()) {
      zs_.next_out = dst + got;
      zs_.avail_out = static_cast<uInt>(std::min<size_t>(n - got, 1u << 30));
      if (zs_.avail_in == 0 && rest_ > 0) refill();
      const uInt before = zs_.avail_out;
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      got += before - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        if (zs_.avail_in == 0 && rest_ == 0) {
          ended_ = true;
        } else if (zs_.avail_in >= 2 && zs_.next_in[0] == 0x1f && zs_.next_in[1] == 0x8b) {
          inflateReset(&zs_);  // another gzip member follows (as gzip -c a b > ab writes)
        } else {
          error_ = std::to_string(zs_.avail_in + rest_) + " bytes after the end of the gzip data";
        }
      } else if (rc == Z_BUF_ERROR && zs_.avail_in == 0 && rest_ == 0) {
        error_ = "the gzip data ends early (compressed file truncated)";
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        error_ = std::string("damaged gzip data: ") + (zs_.msg ? zs_.msg : zError(rc)) +
                 (zs_.msg && std::string(zs_.msg) == "incorrect data check"
                      ? " (the CRC-32 in the gzip trailer does not match the data)"
                      : "");
      }
    }
    crc_ = crc32_z(crc_, dst, got);
    decoded_ += static_cast<int64_t>(got);
    return got;
  }
  const std::string& error() const { return error_; }
  uint32_t crc() const { return static_cast<uint32_t>(crc_); }
  int64_t decoded() const { return decoded_; }

 private:
  void refill() {
    const size_t take = std::min<size_t>(rest_, UINT32_MAX);
    zs_.avail_in = static_cast<uInt>(take);
    rest_ -= take;
  }
  z_stream zs_{};
  size_t rest_ = 0;  // input bytes after the avail_in window (files over 4 GiB)
  bool ended_ = false;
  std::string error_;
  uLong crc_ = crc32_z(0, Z_NULL, 0);
  int64_t decoded_ = 0;
};

// What to do about a corrupt dataset file: Debian's is reinstalled, another replaced.
std::string corrupt_file_fix(const std::string& path) {
  if (path.starts_with(std::string(kFashionMnistDir) + "/"))
    return "reinstall it with `apt-get install --reinstall dataset-fashion-mnist`";
  return std::string("replace it with a good copy (Debian's dataset-fashion-mnist puts them in ") +
         kFashionMnistDir + ")";
}

}  // namespace

IdxArray decode_idx_gz(std::span<const uint8_t> gz, const std::string& path, int expected_ndim) {
  auto fail_file = [&](const std::string& what) {
    RZ_CHECK(false, path << ": " << what << "; the file is corrupt, " << corrupt_file_fix(path));
  };
  if (gz.size() < 2 || gz[0] != 0x1f || gz[1] != 0x8b)
    fail_file("not a gzip file (it must start with the bytes 1f 8b)");
  GzipReader reader(gz);
  // Reads exactly n bytes or fails naming what was being read (and the gzip damage, if any).
  auto read_exact = [&](uint8_t* dst, size_t n, const std::string& what) {
    const size_t got = reader.read(dst, n);
    if (got == n) return;
    if (!reader.error().empty()) fail_file(reader.error() + " while reading " + what);
    fail_file(what + " (" + std::to_string(got) + " of " + std::to_string(n) + " bytes present)");
  };
  uint8_t header[4];
  read_exact(header, 4, "shorter than the 4-byte IDX magic number");
  // Magic: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
  if (header[0] != 0 || header[1] != 0 || header[2] != 0x08 || header[3] != expected_ndim) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "bad magic 0x%02x%02x%02x%02x, expected 0x000008%02x", header[0],
                  header[1], header[2], header[3], expected_ndim);
    fail_file(buf);
  }
  IdxArray arr;
  for (int d = 0; d < expected_ndim; ++d) {
    uint8_t b[4];
    read_exact(b, 4, "truncated in the dimension sizes");
    arr.dims.push_back((int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3]);
  }
  const int64_t total = checked_product(arr.dims, path + ": IDX data size");
  if (total > kMaxIdxBytes)
    fail_file("dimensions " + shape_str(arr.dims) + " claim " + std::to_string(total) +
              " data bytes, more than this reader's limit of " + std::to_string(kMaxIdxBytes));
  // Grow with what arrives: a header that lies about the size costs nothing.
  constexpr int64_t kChunk = int64_t{1} << 20;
  while (static_cast<int64_t>(arr.data.size()) < total) {
    const size_t at = arr.data.size();
    const size_t want = static_cast<size_t>(std::min(kChunk, total - static_cast<int64_t>(at)));
    arr.data.resize(at + want);
    const size_t got = reader.read(arr.data.data() + at, want);
    if (got == want) continue;
    if (!reader.error().empty())
      fail_file(reader.error() + " after " + std::to_string(at + got) + " of " +
                std::to_string(total) + " data bytes");
    fail_file("truncated: " + std::to_string(at + got) + " of " + std::to_string(total) +
              " data bytes present");
  }
  uint8_t extra;
  if (reader.read(&extra, 1) != 0)
    fail_file("trailing bytes after " + std::to_string(total) + " data bytes");
  if (!reader.error().empty()) fail_file(reader.error());
  arr.crc32 = reader.crc();
  arr.decoded_bytes = reader.decoded();
  return arr;
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  const std::string kind = file_kind(dir);
  RZ_CHECK(kind == "a directory", "Fashion-MNIST directory '"
                                      << dir << "' " << (kind.empty() ? "not found" : "is " + kind)
                                      << "; give --data-dir a directory that holds the four .gz "
                                         "files (scripts/setup installs Debian's "
                                         "dataset-fashion-mnist in the default, "
                                      << kFashionMnistDir << ")");
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
  ds.source = dir + (train ? " train" : " test");
  ds.crc32 = static_cast<uint32_t>(crc32_combine(images.crc32, labels.crc32, labels.decoded_bytes));
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
  ds.source = "synthetic n=" + std::to_string(n) + " in=" + std::to_string(in_features) +
              " out=" + std::to_string(out_features) + " seed=" + std::to_string(seed) +
              " stream=" + std::to_string(stream);
  uLong crc = crc32_z(0, Z_NULL, 0);
  crc = crc32_z(crc, reinterpret_cast<const Bytef*>(ds.inputs.data()),
                static_cast<size_t>(ds.inputs.size()) * sizeof(float));
  crc = crc32_z(crc, reinterpret_cast<const Bytef*>(ds.targets.data()),
                static_cast<size_t>(ds.targets.size()) * sizeof(float));
  ds.crc32 = static_cast<uint32_t>(crc);
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

std::span<const int64_t> rank_micro_batch(const Sampler& sampler, int64_t t, int rank,
                                          int world_size, int64_t grad_accum_steps,
                                          int64_t micro_step) {
  return sampler.chunk(t, rank * grad_accum_steps + micro_step, world_size * grad_accum_steps);
}

}  // namespace ringzero
