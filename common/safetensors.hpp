// safetensors: load and save named float32 tensors in the format the ecosystem shares.
//
// Format (huggingface/safetensors README): 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}, then the raw little-endian data; offsets are relative to the data.
// Names are PyTorch state_dict() names ("0.weight", "0.bias", ...), so torch can load our files
// with safetensors.torch.load_file and we can load its.
// Leaves out: dtypes other than F32, memory mapping, big-endian hosts.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "nn.hpp"

namespace ringzero {

struct NamedTensor {
  Shape shape;
  std::vector<float> values;
};

/// The bytes of a safetensors file holding `tensors` (what save_safetensors writes).
std::string safetensors_bytes(const std::map<std::string, NamedTensor>& tensors);
/// Writes tensors (sorted by name, as the reference implementation does). Errors: unwritable path.
void save_safetensors(const std::string& path, const std::map<std::string, NamedTensor>& tensors);
/// Reads every tensor. Errors (each names the file): missing, truncated, header not JSON,
/// dtype not F32, offsets out of range or not matching the shape.
std::map<std::string, NamedTensor> load_safetensors(const std::string& path);

/// The model's parameters as a state dict (copies).
std::map<std::string, NamedTensor> state_dict(const Model& model);
/// Copies a state dict into the model. Errors: a missing name, an unexpected name, a shape
/// that differs (names the tensor and both shapes).
void load_state_dict(Model& model, const std::map<std::string, NamedTensor>& tensors,
                     const std::string& source);

}  // namespace ringzero
