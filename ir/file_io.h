// File output shared by every tool and writer: nothing half-written is ever left behind (a temporary name, then rename).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/status.h"

namespace tpc {

Status writeFileAtomically(const std::string& path, std::string_view contents);
// The same for a file written from pieces, in order, without joining them first (a checkpoint's tensors: one copy
// of them in memory, not two).
Status writeFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces);

// Where a file written to `path` goes: `path`, or the file a symbolic link there points to (followed to its end, as
// a shell's > does, but not past a stream or a /proc/.../fd/N or /dev/fd/N link), so that writing replaces the target
// and keeps the link.
std::string outputTarget(const std::string& path);
// Whether `path` is a FIFO, a device or a socket (a named pipe, /dev/null): written into directly, as a shell's >
// does, never replaced by a regular file.
bool isStreamFile(const std::string& path);
// Whether outputTarget's `target` is written into where it is: a stream, or a descriptor link (/dev/stdout ->
// /proc/self/fd/1, whatever the shell redirected it to).
bool writtenInPlace(const std::string& target);
// Whether `path` (followed as outputTarget does) is a regular file that writing from its start would empty: not a
// stream nor a descriptor link (/dev/stdout redirected to a file is appended to, never truncated), nor missing.
bool truncatableFile(const std::string& path);

// Removes the file `path` (or a folder of files, one level deep) if SIGINT, SIGTERM or SIGHUP ends the process while
// this object lives: destructors do not run then, so Ctrl-C during a long write would leave its temporary file
// behind. The process still dies of the signal (a shell sees 130 for Ctrl-C). A signal that is ignored (nohup) or has
// a handler of someone else's is left alone. At most 16 paths are guarded at once, and no path longer than PATH_MAX.
class RemoveOnSignal {
 public:
  RemoveOnSignal() = default;
  explicit RemoveOnSignal(const std::string& path);
  RemoveOnSignal(RemoveOnSignal&& o) noexcept : slot_(std::exchange(o.slot_, -1)) {}
  RemoveOnSignal& operator=(RemoveOnSignal&& o) noexcept;
  ~RemoveOnSignal() { release(); }
  // Stops guarding (the file was renamed into place, or removed).
  void release();

 private:
  int slot_ = -1;
};

// Files (or folders) replaced together, as one: a dataset's .bin and .idx, a model file and its weights, a Hugging
// Face model's config and tensors. A failure or a signal between two separate atomic writes would pair a new file with
// an old one. Each is first written in full under a temporary name of its own, PATH.tmp.HOST.PID.N (unique to this
// process and call, so two runs writing one PATH never share a temporary), guarded by RemoveOnSignal; staging one
// removes PATH's temporaries that processes of this machine which no longer run left behind (a SIGKILL). commit() then moves them
// all into place in the order they were added:
//  - with SIGINT, SIGTERM and SIGHUP held off until the last is in place (one that comes meanwhile ends the process
//    after the commit, not between two of its renames);
//  - under a lock on each target's folder (flock), so two processes committing the same names do not interleave:
//    the files in place are all of one commit or all of the other;
//  - a rename that fails midway puts back what the earlier ones replaced.
// A FileCommit destroyed without commit() removes its temporary files. Either way, on failure the old files stay as
// they were, byte for byte. For tests of the tools (another process), TPC_TEST_SIGINT_AFTER_RENAME=NAME in the
// environment raises SIGINT right after a file named NAME is moved into place.
class FileCommit {
 public:
  FileCommit() = default;
  FileCommit(FileCommit&& o) noexcept : entries_(std::exchange(o.entries_, {})) {}
  FileCommit& operator=(FileCommit&& o) noexcept;
  FileCommit(const FileCommit&) = delete;
  FileCommit& operator=(const FileCommit&) = delete;
  ~FileCommit() { discard(); }

  // A temporary path for `path`, guarded, for the caller to fill (a stream too large to hold in memory, or a folder of
  // files); commit() moves it to `path`. Nothing is created.
  std::string stage(const std::string& path);
  // Writes `contents` (or the pieces, in order, without joining them) to a new temporary for `path`, flushed.
  Status write(const std::string& path, std::string_view contents);
  Status write(const std::string& path, const std::vector<std::string_view>& pieces);
  // Moves every temporary into place (see above). An error names the file; the temporaries are gone either way.
  Status commit();
  // Removes the temporaries (also what the destructor does).
  void discard();

  // Tests only: called before each rename of a commit with its index (0, 1, ...), to raise a signal or break a rename
  // between two of them. Null: none.
  using StepHook = void (*)(size_t step);
  static void setStepHookForTesting(StepHook hook);
  // Tests only: true moves each old file aside before the new one takes its place, as where the file system cannot
  // exchange two names (renameat2 RENAME_EXCHANGE).
  static void setMoveAsideForTesting(bool on);

 private:
  struct Entry {
    std::string path, tmp;
    RemoveOnSignal guard;
  };
  std::vector<Entry> entries_;
};

// The outermost folder of `path` (itself included) that does not exist yet: what create_directories(path) would
// make, for removing it again. Empty when `path` exists.
std::filesystem::path firstMissingFolder(const std::filesystem::path& path);

// Removes `path` (a folder and all in it) when destroyed, unless keep() was called: a write that fails midway
// leaves nothing behind.
class RemoveOnError {
 public:
  explicit RemoveOnError(std::filesystem::path path) : path_(std::move(path)) {}
  RemoveOnError(const RemoveOnError&) = delete;
  RemoveOnError& operator=(const RemoveOnError&) = delete;
  ~RemoveOnError() {
    std::error_code ec;
    if (!kept_ && !path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  void keep() { kept_ = true; }

 private:
  std::filesystem::path path_;
  bool kept_ = false;
};

}  // namespace tpc
