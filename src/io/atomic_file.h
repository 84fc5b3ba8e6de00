// Crash-safe writes: a file appears under its name whole or not at all, and stays after a power
// loss once the call returns. Write to a new temp file `<path>.tmp.<pid>-<n>` in the same folder,
// fsync it, rename it over `path`, fsync the folder. A process killed mid-write leaves only the
// temp file behind (is_output_file() in actcap/export.h lets --resume and --overwrite remove it).
//
// A temp file is always created new (O_EXCL), never opened over a name that exists: a leftover
// under that name (a dead process's, maybe of the same pid) may be a hard link to a live file
// (remove_if_same killed between its link and its unlink leaves one), which a truncating open
// would write through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace actcap {

// A file's identity (device and inode): what a name pointed at, told apart from whatever a rename
// puts under that name later.
struct FileId {
  uint64_t device = 0, inode = 0;
  bool operator==(const FileId& o) const { return device == o.device && inode == o.inode; }
  bool operator!=(const FileId& o) const { return !(*this == o); }
};
// The identity of the file `path` names now; nullopt when it names none.
std::optional<FileId> file_id(const std::string& path);

// A file held open (read-only), its identity pinned: a file held open is never freed, so no file
// written later can take its inode number, as one can (ext4 reuses numbers at once) after the
// file a bare FileId was taken of is removed. Move-only; closes the file when destroyed.
class HeldFile {
 public:
  HeldFile() = default;
  HeldFile(HeldFile&& other) noexcept;
  HeldFile& operator=(HeldFile&& other) noexcept;
  HeldFile(const HeldFile&) = delete;
  HeldFile& operator=(const HeldFile&) = delete;
  ~HeldFile();
  bool held() const { return fd_ >= 0; }
  const FileId& id() const { return id_; }  // meaningful only while held()

 private:
  friend std::optional<HeldFile> hold_file(const std::string& path);
  friend HeldFile hold_fd(int fd, const std::string& path);
  int fd_ = -1;
  FileId id_;
};
// The file `path` names now, held open; nullopt when it names none or cannot be opened.
std::optional<HeldFile> hold_file(const std::string& path);

// `<path>.tmp.<pid>-<n>`: the n-th name this process tries for a temp file of `path`.
std::string temp_name_for(const std::string& path, unsigned n);
// The inverse: the name a temp file `<name>.tmp.<digits>` or `<name>.tmp.<digits>-<digits>` was
// written for (the first form is what earlier versions wrote); `name` itself when it is not such
// a temp name.
std::string temp_target(const std::string& name);

// A new temp file for `path`, created (O_CREAT | O_EXCL, mode 0644, with `flags` added) under the
// first name temp_name_for(path, 0, 1, ...) that names nothing; its name goes to `*name`. Returns
// the open descriptor; RunError naming `path` when none can be created.
int create_temp_for(const std::string& path, int flags, std::string* name);

// Writes all `n` bytes, resuming after partial writes (as happen when RLIMIT_FSIZE is reached) so
// that the error reported is the one that stopped us (EFBIG, ENOSPC), not a short count.
// RunError naming `path` on failure.
void write_all(int fd, const void* buf, size_t n, const std::string& path);

// fsync of the folder holding `path`, making a rename into it durable. RunError on failure
// (filesystems that cannot sync folders at all, EINVAL/EROFS, are accepted).
void fsync_parent_dir(const std::string& path);

// The whole sequence: `write_body(fd)` writes the contents (with write_all), then fsync, close (its
// deferred errors checked too), rename, fsync of the folder. RunError naming `path`; on any
// failure, including one thrown by `write_body`, the temp file is removed and `path` untouched.
// Returns the file written, held open (opened before the rename; another process may rename over
// it at once).
HeldFile write_file_atomic(const std::string& path, const std::function<void(int fd)>& write_body);
// The same for a small text file (manifests, config.json).
HeldFile write_file_atomic(const std::string& path, const std::string& text);

// Removes `path` if it names `file` (held open, so that no newer file can have its identity), and
// only then, even while other processes rename files over it: the file is first moved aside (to
// a temp name that names nothing), and one that is not `file` is put back unless a newer one took
// its name meanwhile (then it is stale and goes). For a moment the name names nothing. Returns
// whether `file` was removed; false when `path` named another file or none, or `file` is not held.
// RunError when the name cannot be moved or restored.
bool remove_if_same(const std::string& path, const HeldFile& file);

}  // namespace actcap
