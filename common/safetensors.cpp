#include "safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>

#include "check.hpp"

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
  const std::string bytes = safetensors_bytes(tensors);
  std::ofstream out(path, std::ios::binary);
  RZ_CHECK(out, "cannot write " << path << "; check the directory exists and is writable");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  RZ_CHECK(out.good(), "writing " << path << " failed (disk full?)");
}

std::map<std::string, NamedTensor> load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RZ_CHECK(in, "safetensors file " << path << " not found or unreadable");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RZ_CHECK(bytes.size() >= 8,
           path << ": " << bytes.size() << " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  RZ_CHECK(n <= bytes.size() - 8,
           path << ": header length " << n << " exceeds the file (" << bytes.size() << " bytes)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  } catch (const nlohmann::json::exception& e) {
    RZ_CHECK(false, path << ": header is not valid JSON (" << e.what() << ")");
  }
  const int64_t data_size = static_cast<int64_t>(bytes.size() - 8 - n);
  const char* data = bytes.data() + 8 + n;
  std::map<std::string, NamedTensor> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    RZ_CHECK(info.value("dtype", "") == "F32",
             path << ": tensor " << name << " has dtype " << info.value("dtype", "?")
                  << "; only F32 is supported (convert with tensor.float())");
    NamedTensor t;
    t.shape = info.at("shape").get<Shape>();
    const auto offsets = info.at("data_offsets").get<std::vector<int64_t>>();
    RZ_CHECK(offsets.size() == 2 && 0 <= offsets[0] && offsets[0] <= offsets[1] &&
                 offsets[1] <= data_size,
             path << ": tensor " << name << " data_offsets out of range of the " << data_size
                  << " data bytes");
    RZ_CHECK(offsets[1] - offsets[0] == numel(t.shape) * 4,
             path << ": tensor " << name << " holds " << offsets[1] - offsets[0] << " bytes, shape "
                  << shape_str(t.shape) << " needs " << numel(t.shape) * 4);
    t.values.resize(static_cast<size_t>(numel(t.shape)));
    if (!t.values.empty())  // an empty vector's data() may be null, which memcpy must not see
      std::memcpy(t.values.data(), data + offsets[0], static_cast<size_t>(offsets[1] - offsets[0]));
    out.emplace(name, std::move(t));
  }
  return out;
}

std::map<std::string, NamedTensor> state_dict(const Model& model) {
  std::map<std::string, NamedTensor> out;
  for (Parameter* p : model.parameters())
    out[p->name()] = {p->shape(), {p->data.span().begin(), p->data.span().end()}};
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
    std::copy(it->second.values.begin(), it->second.values.end(), p->data.data());
  }
  RZ_CHECK(tensors.size() == model.parameters().size(), source << " has " << tensors.size()
                                                               << " tensors, the model "
                                                               << model.parameters().size());
}

}  // namespace ringzero
