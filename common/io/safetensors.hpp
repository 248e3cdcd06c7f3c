// safetensors: load and save named float32 tensors in the format the ecosystem shares.
//
// Format (huggingface/safetensors README): 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}, then the raw little-endian data; offsets are relative to the data.
// Names are PyTorch state_dict() names ("0.weight", "0.bias", ...), so torch can load our files
// with safetensors.torch.load_file and we can load its.
// Leaves out: dtypes other than F32, memory mapping, big-endian hosts.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/core/nn.hpp"

namespace ringzero {

struct NamedTensor {
  Shape shape;
  std::vector<float> values;
};

/// The bytes of a safetensors file holding `tensors` (what save_safetensors writes).
std::string safetensors_bytes(const std::map<std::string, NamedTensor>& tensors);
/// Writes tensors (sorted by name, as the reference implementation does), atomically
/// (common/io/atomic_file.hpp: a crash mid-write leaves the previous file intact). Errors:
/// unwritable path, full disk (each names the path).
void save_safetensors(const std::string& path, const std::map<std::string, NamedTensor>& tensors);

/// Parses JSON `text` (from `file`) refusing any object that gives one key twice, naming the
/// file and the key: nlohmann's parser keeps the last, so a header or manifest listing a tensor
/// twice would load silently. The format (RFC 8259 §4) leaves duplicates' meaning undefined.
/// Errors: invalid JSON (nlohmann's message), duplicate keys and nesting deeper than 64 levels
/// (which would overflow the stack of nlohmann's recursive printing), each naming `file`.
nlohmann::json parse_json_unique_keys(std::string_view text, const std::string& file);

/// Reads every tensor of the file at `path`: parse_safetensors on its bytes.
/// Errors: a missing or unreadable file, and every error of parse_safetensors.
std::map<std::string, NamedTensor> load_safetensors(const std::string& path);

/// Parses a whole safetensors file held in memory; `file` names it in every error. Enforces
/// the format's rules (huggingface/safetensors README, "Format" and "Notes"): the 8-byte
/// header length fits the file and is at most 100 MB; the header is a JSON object whose
/// values are objects with a string "dtype" (only "F32" is supported), a "shape" array of
/// non-negative integers and "data_offsets" [begin, end] of non-negative integers;
/// "__metadata__", if present, maps strings to strings; element and byte counts do not
/// overflow; the data ranges, sorted, are contiguous, do not overlap and cover the data
/// section exactly (no holes: the format forbids polyglot files). Every error names the file
/// and, where there is one, the tensor. Never reads outside `bytes`, never allocates more
/// than the file's size.
std::map<std::string, NamedTensor> parse_safetensors(std::span<const uint8_t> bytes,
                                                     const std::string& file);

/// The model's parameters as a state dict (copies).
std::map<std::string, NamedTensor> state_dict(const Model& model);
/// Copies a state dict into the model. Errors: a missing name, an unexpected name, a shape
/// that differs (names the tensor and both shapes), a non-finite value (names the tensor, the
/// flat index and the value: initial weights must be finite, or the first step's NaN would be
/// blamed on the learning rate).
void load_state_dict(Model& model, const std::map<std::string, NamedTensor>& tensors,
                     const std::string& source);

}  // namespace ringzero
