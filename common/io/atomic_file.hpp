// atomic_file: outputs that are written whole or not at all, and checked before training.
//
// Provides: write_file_atomically (temporary file in the target's directory, written, flushed,
// fsync'ed, then renamed over the target, and the directory fsync'ed: POSIX rename(2) is
// atomic, so a crash or a full disk mid-write leaves the previous file intact; the recipe of
// PyTorch's torch.save callers and of safetensors' own writers) and check_output_path (create
// and remove a temporary file in the target's directory before the first step, so an
// unwritable --save-final fails in seconds instead of after the last step).
// Also RecordFile, for the one output that is streamed instead (--metrics, JSON lines): a
// run's metrics are read while it trains (tail -f, scripts/plot), and a run killed at step 900
// should keep its 900 steps, which a rename at the end would lose. So the file is appended to,
// one whole record per write(2), and a failed or short write is cut back (ftruncate) to the last
// whole record before the run stops: a crash or a full disk leaves a valid prefix of records.
// What stands at a path is checked first (resolve_output, check_input_file): a symlink is
// followed to the file it names and never replaced by a regular file; a character device
// (/dev/null, a terminal) is written through, without a rename; a directory, FIFO, socket or
// block device is refused, naming it (a FIFO would block the run forever: no reader opens it).
// Leaves out: Windows, network file systems whose rename is not atomic.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ringzero {

/// Options of write_file_atomically beyond the defaults.
struct AtomicWriteOptions {
  /// Appended to the error message: what the user can do (e.g. "point --checkpoint-dir
  /// elsewhere").
  std::string advice;
  /// Test hook (tests/chapters/ckpt_faults.sh, through RINGZERO_TEST_KILL_IN_CHECKPOINT): the
  /// process kills itself (SIGKILL) once half the bytes are written, a crash mid-write.
  bool kill_halfway = false;
};

/// Past a file-size limit (ulimit -f) the kernel kills a writing process with SIGXFSZ; ignored
/// (process-wide, from the first writer on), write(2) fails with EFBIG instead, and the writers
/// here name the file, as for ENOSPC.
void ignore_file_size_signal();

/// Writes `bytes` to `path` atomically: path's directory gets "<name>.tmp.XXXXXX", the bytes
/// are written and fsync'ed, the temporary is renamed over `path`, and the directory is
/// fsync'ed. Errors (each names the path and the OS reason, e.g. "No space left on device"):
/// the directory is missing or unwritable, a write or fsync fails, the rename fails. On any
/// error the temporary file is removed and `path` is untouched.
void write_file_atomically(const std::string& path, std::string_view bytes,
                           const AtomicWriteOptions& options = {});

/// A file of records (e.g. JSON lines) that always holds whole records, for a streamed output.
/// Errors name `flag`, the path, the records kept and the OS reason.
class RecordFile {
 public:
  RecordFile() = default;  ///< no file: append() does nothing
  /// Creates or truncates `path` (truncate false: opens it to append after its records).
  /// Errors: the directory is missing or unwritable.
  RecordFile(const std::string& path, std::string flag, bool truncate = true);
  ~RecordFile();
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  bool is_open() const { return fd_ >= 0; }
  /// Appends `record` (its own newline included) with one write(2), flushed to the kernel. If
  /// the write fails or is short (disk full, file size limit), the file is cut back to the
  /// records before it, then the error is raised: the file stays a valid prefix.
  void append(std::string_view record);

 private:
  int fd_ = -1;
  bool device_ = false;  ///< a character device (/dev/null): written through, never cut back
  std::string path_, flag_;
  int64_t size_ = 0, records_ = 0;
};

/// Checks before training that `path` (given by `flag`, e.g. "--save-final") can be written:
/// resolve_output accepts it, and the directory of the file it names accepts a new file (one is
/// created and removed again). An empty path is accepted (the output is off). Errors name the
/// flag, the path, the OS reason and the fix (for a directory: PATH/`example_name`).
void check_output_path(const std::string& flag, const std::string& path,
                       const std::string& example_name = "out");

/// Whether a file named like `stem` can be created now: "<stem>.tmp.XXXXXX" is created
/// (exclusive) and removed again, so whatever would refuse the real write refuses this one
/// too (permissions, a read-only file system, no inodes, an NFS server that maps root to
/// nobody), where access(2) tests only the permissions and the mount. For a directory D, pass
/// D/".write-test". Returns "" when it can; else "(the OS reason); " and the fix: `fix`, or, for
/// a name too long with the temporary file's suffix, a shorter name; for a directory that takes
/// files in but lets none go (chattr +a: a rename over the output fails too), the probe left
/// there by name.
std::string file_creation_refused(const std::string& stem,
                                  const std::string& fix = "choose a writable directory");

/// "a directory", "a FIFO (named pipe)", "a socket", "a block device", "a character device",
/// "a regular file", "a dangling symbolic link" (a link to nothing, or a loop) for what stands
/// at `path` (symlinks followed), or "" when nothing does.
std::string file_kind(const std::string& path);

/// Where an output given as `path` lands. Symlinks are followed: `path` is the file the link
/// names, existing or not yet (so the rename replaces or creates that file, and the link
/// stays). `device` is true for a character device (/dev/null, /dev/tty) and for this
/// process's own streams (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: a terminal, a
/// pipe or the file a shell redirected to): written through, appended, no temporary file and
/// no rename. Errors (naming `flag`, the path and what stands there): a path ending in /, which
/// names a directory whatever stands there, and a directory (for both the fix
/// suggests PATH/`example_name`, a file name of the caller's kind, e.g. "trace.json"), FIFO,
/// socket or block device, a loop of symlinks.
struct OutputTarget {
  std::string path;
  bool device = false;
};
OutputTarget resolve_output(const std::string& flag, const std::string& path,
                            const std::string& example_name = "out");

/// Refuses two paths (flag, path) that land on the same file (after resolve_output: a symlink
/// and its target, or two hard links, are one file), naming both flags and the file, before
/// any is written: one would silently overwrite the other (an input, such as --init-from, may
/// be in the list too). Empty paths and devices (--metrics /dev/null --trace /dev/null) are
/// not compared.
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

/// Checks that `path` (described by `what`, e.g. "--init-from" or "dataset file") is a
/// regular file, at once: a missing path is named as missing, a directory, FIFO, device or
/// socket as what it is (a FIFO would block the read forever, a directory fails later with a
/// misleading message). `fix` ends the message.
void check_input_file(const std::string& what, const std::string& path, const std::string& fix);

}  // namespace ringzero
