#include "common/io/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "common/core/check.hpp"
#include "common/core/checked.hpp"
#include "common/core/device_memory.hpp"
#include "common/io/atomic_file.hpp"

namespace ringzero {

std::string safetensors_bytes(const std::map<std::string, NamedTensor>& tensors) {
  nlohmann::json header;
  header["__metadata__"] = {{"format", "pt"}, {"producer", "ringzero"}};
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = static_cast<int64_t>(t.values.size() * sizeof(float));
    header[name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string out;
  out.reserve(8 + h.size() + static_cast<size_t>(offset));
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>(static_cast<unsigned char>(n >> (8 * i))));
  out += h;
  for (const auto& [name, t] : tensors)
    out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, NamedTensor>& tensors) {
  write_file_atomically(path, safetensors_bytes(tensors));
}

nlohmann::json parse_json_unique_keys(std::string_view text, const std::string& file) {
  constexpr int kMaxJsonDepth = 64;
  // The keys seen in each object being parsed, innermost last.
  std::vector<std::vector<std::string>> open;
  const nlohmann::json::parser_callback_t unique = [&](int depth, nlohmann::json::parse_event_t event,
                                                       nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    // Neither format nests past a few levels; a deeper value would overflow the stack of the
    // recursive code that prints or frees it.
    RZ_CHECK(depth <= kMaxJsonDepth, file << ": the JSON nests deeper than " << kMaxJsonDepth
                                          << " levels; no safetensors header or manifest does, "
                                             "the file is damaged");
    if (event == E::object_start) open.emplace_back();
    if (event == E::object_end && !open.empty()) open.pop_back();
    if (event == E::key && !open.empty()) {
      const std::string key = parsed.get<std::string>();
      std::vector<std::string>& keys = open.back();
      RZ_CHECK(std::find(keys.begin(), keys.end(), key) == keys.end(),
               file << ": the JSON names \"" << key << "\" twice in one object (a tensor or "
                    << "field given twice: which one is meant is undefined); the file is damaged "
                       "or was not written by a safetensors/RingZero writer");
      keys.push_back(key);
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, unique);
  } catch (const nlohmann::json::exception& e) {
    RZ_CHECK(false, file << ": not valid JSON (" << e.what() << ")");
  }
  return {};
}

std::map<std::string, NamedTensor> load_safetensors(const std::string& path) {
  check_input_file("safetensors file", path,
                   "give a .safetensors file (e.g. one written by --save-final)");
  std::ifstream in(path, std::ios::binary);
  RZ_CHECK(in, "safetensors file " << path << " not found or unreadable");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  RZ_CHECK(!in.bad(), "reading " << path << " failed");
  return parse_safetensors(bytes, path);
}

namespace {

// A JSON value that is a non-negative integer that fits int64, or an error naming `what`.
int64_t non_negative_int(const nlohmann::json& v, const std::string& file, const std::string& name,
                         const char* what) {
  RZ_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
           file << ": tensor " << name << ": " << what << " has " << v.dump()
                << ", expected a non-negative integer");
  const uint64_t u = v.get<uint64_t>();
  RZ_CHECK(u <= static_cast<uint64_t>(INT64_MAX),
           file << ": tensor " << name << ": " << what << " " << u << " exceeds 2^63 - 1");
  return static_cast<int64_t>(u);
}

/// One tensor's description in the header: its name, shape and byte range in the data.
struct Entry {
  std::string name;
  Shape shape;
  int64_t begin = 0, end = 0;
};

/// The header's length n: the file's first 8 bytes (little-endian), checked against the file's
/// size and the format's 100 MB limit. `bytes`: the whole file.
uint64_t header_length(std::span<const uint8_t> bytes, const std::string& file) {
  RZ_CHECK(bytes.size() >= 8,
           file << ": " << bytes.size() << " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  RZ_CHECK(n <= bytes.size() - 8,
           file << ": header length " << n << " exceeds the file (" << bytes.size() << " bytes)");
  constexpr uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit
  RZ_CHECK(n <= kMaxHeader, file << ": header length " << n << " exceeds the format's 100 MB");
  return n;
}

/// The header: the n bytes after its length, a JSON object with each key once.
nlohmann::json parse_header(std::span<const uint8_t> bytes, uint64_t n, const std::string& file) {
  nlohmann::json header = parse_json_unique_keys(
      std::string_view(reinterpret_cast<const char*>(bytes.data()) + 8, n), file + " header");
  RZ_CHECK(header.is_object(), file << ": header is a JSON " << header.type_name()
                                    << ", the format requires an object {name: {dtype, shape, "
                                       "data_offsets}}");
  return header;
}

/// The header's "__metadata__" entry: an object of strings.
void check_metadata(const nlohmann::json& info, const std::string& file) {
  RZ_CHECK(info.is_object(), file << ": __metadata__ is a JSON " << info.type_name()
                                  << ", the format requires an object of strings");
  for (const auto& [key, value] : info.items())
    RZ_CHECK(value.is_string(), file << ": __metadata__[\"" << key << "\"] is a JSON "
                                     << value.type_name() << ", the format requires a string");
}

/// Tensor `name`'s header entry `info`, checked: an F32 tensor whose data_offsets lie in the
/// data_size bytes of data and hold exactly its shape's elements.
Entry parse_entry(const std::string& name, const nlohmann::json& info, const std::string& file,
                  int64_t data_size) {
  RZ_CHECK(info.is_object(), file << ": tensor " << name << " is described by a JSON "
                                  << info.type_name()
                                  << ", expected an object {dtype, shape, data_offsets}");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    RZ_CHECK(info.contains(field), file << ": tensor " << name << " has no \"" << field << "\"");
  const auto& dtype = info["dtype"];
  RZ_CHECK(dtype.is_string(), file << ": tensor " << name << ": dtype is a JSON "
                                   << dtype.type_name() << ", expected a string");
  RZ_CHECK(dtype.get<std::string>() == "F32",
           file << ": tensor " << name << " has dtype " << dtype.get<std::string>()
                << "; only F32 is supported (convert with tensor.float())");
  const auto& shape = info["shape"];
  RZ_CHECK(shape.is_array(), file << ": tensor " << name << ": shape is a JSON "
                                  << shape.type_name() << ", expected an array of integers");
  Entry e;
  e.name = name;
  for (const auto& d : shape) e.shape.push_back(non_negative_int(d, file, name, "shape"));
  const auto& offsets = info["data_offsets"];
  RZ_CHECK(offsets.is_array() && offsets.size() == 2,
           file << ": tensor " << name << ": data_offsets is " << offsets.dump()
                << ", expected [begin, end]");
  e.begin = non_negative_int(offsets[0], file, name, "data_offsets");
  e.end = non_negative_int(offsets[1], file, name, "data_offsets");
  RZ_CHECK(e.begin <= e.end && e.end <= data_size,
           file << ": tensor " << name << " data_offsets [" << e.begin << ", " << e.end
                << "] out of range of the " << data_size << " data bytes");
  const int64_t elements = checked_product(e.shape, file + ": tensor " + name + " element count");
  const int64_t need = checked_mul(elements, 4, file + ": tensor " + name + " byte count");
  RZ_CHECK(e.end - e.begin == need, file << ": tensor " << name << " holds " << e.end - e.begin
                                         << " bytes, shape " << shape_str(e.shape) << " needs "
                                         << need);
  return e;
}

/// Sorts `entries` by their data ranges and checks that the ranges tile the data_size bytes of
/// data: no overlap, no hole, no trailing bytes.
void check_tiling(std::vector<Entry>& entries, int64_t data_size, const std::string& file) {
  // The data ranges, in file order, must tile [0, data_size): no overlap, no hole.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    RZ_CHECK(e.begin >= covered, file << ": tensor " << e.name << " data [" << e.begin << ", "
                                      << e.end << ") overlaps tensor " << previous->name << " ["
                                      << previous->begin << ", " << previous->end << ")");
    RZ_CHECK(e.begin == covered, file << ": bytes [" << covered << ", " << e.begin
                                      << ") of the data belong to no tensor (before tensor "
                                      << e.name << "); the format forbids holes");
    covered = e.end;
    previous = &e;
  }
  RZ_CHECK(covered == data_size, file << ": bytes [" << covered << ", " << data_size
                                      << ") of the data belong to no tensor; the format forbids "
                                         "trailing data");
}

/// The tensors of checked `entries`, their values copied from `data` (the bytes after the
/// header).
std::map<std::string, NamedTensor> copy_tensors(const std::vector<Entry>& entries,
                                                const uint8_t* data) {
  std::map<std::string, NamedTensor> out;
  for (const Entry& e : entries) {
    NamedTensor t;
    t.shape = e.shape;
    t.values.resize(static_cast<size_t>((e.end - e.begin) / 4));
    if (!t.values.empty())  // an empty vector's data() may be null, which memcpy must not see
      std::memcpy(t.values.data(), data + e.begin, static_cast<size_t>(e.end - e.begin));
    out.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace

std::map<std::string, NamedTensor> parse_safetensors(std::span<const uint8_t> bytes,
                                                     const std::string& file) {
  const uint64_t n = header_length(bytes, file);
  const nlohmann::json header = parse_header(bytes, n, file);
  const int64_t data_size = static_cast<int64_t>(bytes.size() - 8 - n);
  const uint8_t* data = bytes.data() + 8 + n;

  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      check_metadata(info, file);
      continue;
    }
    entries.push_back(parse_entry(name, info, file, data_size));
  }
  check_tiling(entries, data_size, file);
  return copy_tensors(entries, data);
}

std::map<std::string, NamedTensor> state_dict(const Model& model) {
  std::map<std::string, NamedTensor> out;
  for (Parameter* p : model.parameters()) {  // copied to the host from wherever they live
    std::vector<float> values(static_cast<size_t>(p->numel()));
    copy_elements(p->data.span(), std::span<float>(values));
    out[p->name()] = {p->shape(), std::move(values)};
  }
  return out;
}

void load_state_dict(Model& model, const std::map<std::string, NamedTensor>& tensors,
                     const std::string& source) {
  for (Parameter* p : model.parameters()) {
    auto it = tensors.find(p->name());
    RZ_CHECK(it != tensors.end(),
             source << " has no tensor " << p->name() << "; was it saved from this --model?");
    RZ_CHECK(it->second.shape == p->shape(),
             source << ": " << p->name() << " has shape " << shape_str(it->second.shape)
                    << ", the model expects " << shape_str(p->shape()));
    const auto& values = it->second.values;
    for (size_t i = 0; i < values.size(); ++i)
      RZ_CHECK(std::isfinite(values[i]),
               source << ": tensor " << p->name() << " holds " << values[i] << " at index " << i
                      << " of " << values.size()
                      << "; initial weights must be finite (was the file saved after a run "
                         "diverged?)");
    std::copy(values.begin(), values.end(), p->data.data());
  }
  RZ_CHECK(tensors.size() == model.parameters().size(), source << " has " << tensors.size()
                                                               << " tensors, the model "
                                                               << model.parameters().size());
}

}  // namespace ringzero
