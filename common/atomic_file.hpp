// atomic_file: outputs that are written whole or not at all, and checked before training.
//
// Provides: write_file_atomically (temporary file in the target's directory, written, flushed,
// fsync'ed, then renamed over the target, and the directory fsync'ed: POSIX rename(2) is
// atomic, so a crash or a full disk mid-write leaves the previous file intact; the recipe of
// PyTorch's torch.save callers and of safetensors' own writers) and check_output_path (create
// and remove a temporary file in the target's directory before the first step, so an
// unwritable --save-final fails in seconds instead of after the last step).
// Leaves out: Windows, network file systems whose rename is not atomic.
#pragma once

#include <string>
#include <string_view>

namespace ringzero {

/// Writes `bytes` to `path` atomically: path's directory gets "<name>.tmp.XXXXXX", the bytes
/// are written and fsync'ed, the temporary is renamed over `path`, and the directory is
/// fsync'ed. Errors (each names the path and the OS reason, e.g. "No space left on device"):
/// the directory is missing or unwritable, a write or fsync fails, the rename fails. On any
/// error the temporary file is removed and `path` is untouched.
void write_file_atomically(const std::string& path, std::string_view bytes);

/// Checks before training that `path` (given by `flag`, e.g. "--save-final") can be written:
/// not a directory, and its directory accepts a new file (one is created and removed again).
/// An empty path is accepted (the output is off). Errors name the flag, the path, the OS
/// reason and the fix.
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace ringzero
