#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "actcap/error.h"
#include "util/stage_timer.h"

namespace actcap {

namespace {
std::string errno_str(int e) { return std::strerror(e); }

FileId id_of(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

// Renames `from` to `to` unless `to` names a file: false then (errno EEXIST). Where the
// filesystem cannot refuse atomically, a `to` seen free is taken (the temp names hold this pid:
// no other live process makes them).
bool rename_no_replace(const std::string& from, const std::string& to) {
#ifdef RENAME_NOREPLACE
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return false;
#endif
  struct stat st;
  if (::lstat(to.c_str(), &st) == 0) {
    errno = EEXIST;
    return false;
  }
  return ::rename(from.c_str(), to.c_str()) == 0;
}
}  // namespace

std::optional<FileId> file_id(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return id_of(st);
}

HeldFile::HeldFile(HeldFile&& other) noexcept : fd_(other.fd_), id_(other.id_) { other.fd_ = -1; }

HeldFile& HeldFile::operator=(HeldFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    id_ = other.id_;
    other.fd_ = -1;
  }
  return *this;
}

HeldFile::~HeldFile() {
  if (fd_ >= 0) ::close(fd_);
}

// `fd` (open, read-only) as a HeldFile, which then owns it; RunError naming `path` (and closing
// `fd`) when it cannot be stat'ed.
HeldFile hold_fd(int fd, const std::string& path) {
  HeldFile f;
  f.fd_ = fd;
  struct stat st;
  if (::fstat(fd, &st) != 0)
    throw RunError(concat("cannot write ", path, ": fstat failed: ", errno_str(errno)));
  f.id_ = id_of(st);
  return f;
}

std::optional<HeldFile> hold_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  try {
    return hold_fd(fd, path);
  } catch (const RunError&) {
    return std::nullopt;
  }
}

std::string temp_name_for(const std::string& path, unsigned n) {
  return concat(path, ".tmp.", ::getpid(), "-", n);
}

std::string temp_target(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0) return name;
  // <digits> or <digits>-<digits>
  const size_t dash = name.find('-', at + 5);
  const auto all_digits = [&](size_t from, size_t to) {
    if (from >= to) return false;
    for (size_t i = from; i < to; ++i)
      if (name[i] < '0' || name[i] > '9') return false;
    return true;
  };
  const bool ok = dash == std::string::npos
                      ? all_digits(at + 5, name.size())
                      : all_digits(at + 5, dash) && all_digits(dash + 1, name.size());
  return ok ? name.substr(0, at) : name;
}

namespace {
// The first of temp_name_for(path, 0), (path, 1), ... that `take` succeeds with (returns 0),
// moving on while it fails with EEXIST (returns the errno): the names hold this pid, so only a dead
// process's leftovers (or this process's own temp files) are in the way. "" with `*error` set
// when it fails otherwise; RunError naming `doing` when every name is taken.
std::string first_free_temp(const std::string& path, const std::string& doing, int* error,
                            const std::function<int(const std::string&)>& take) {
  constexpr unsigned kTries = 4096;
  for (unsigned n = 0; n < kTries; ++n) {
    std::string tmp = temp_name_for(path, n);
    *error = take(tmp);
    if (*error == 0) return tmp;
    if (*error != EEXIST) return "";
  }
  throw RunError(concat(doing, ": ", kTries, " temp names ", temp_name_for(path, 0),
                        " ... are all taken; remove the leftover ", path, ".tmp.* files"));
}
}  // namespace

int create_temp_for(const std::string& path, int flags, std::string* name) {
  int fd = -1, error = 0;
  const std::string doing = concat("cannot write ", path);
  *name = first_free_temp(path, doing, &error, [&](const std::string& tmp) {
    fd = ::open(tmp.c_str(), flags | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    return fd >= 0 ? 0 : errno;
  });
  if (name->empty())
    throw RunError(concat(doing, ": creating a temp file beside it failed: ", errno_str(error)));
  return fd;
}

void write_all(int fd, const void* buf, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw RunError(concat("writing ", path, " failed: ", errno_str(errno)));
    }
    if (w == 0) throw RunError(concat("writing ", path, " failed: write returned 0"));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw RunError(concat("wrote ", path, " but cannot open its directory ", dir,
                          " to sync it: ", errno_str(errno)));
  }
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  // Some filesystems cannot sync directories at all; there is nothing more we can do there.
  if (rc != 0 && e != EINVAL && e != EROFS) {
    throw RunError(
        concat("wrote ", path, " but syncing its directory ", dir, " failed: ", errno_str(e)));
  }
}

HeldFile write_file_atomic(const std::string& path, const std::function<void(int fd)>& write_body) {
  // Same folder as the target so that rename() is atomic; a new file, so that concurrent writers
  // never share one and a leftover linked to a live file is never written through.
  std::string tmp;
  int fd = create_temp_for(path, O_WRONLY, &tmp);
  HeldFile written;
  try {
    // Held open from before the rename: its identity stays its own (see HeldFile).
    const int held = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    if (held < 0)
      throw RunError(
          concat("cannot write ", path, ": opening ", tmp, " failed: ", errno_str(errno)));
    written = hold_fd(held, tmp);
    write_body(fd);
    StageTimer fsync_timer("io.fsync");
    if (::fsync(fd) != 0) throw RunError(concat("syncing ", path, " failed: ", errno_str(errno)));
    fsync_timer.stop();
    const int rc = ::close(fd);
    fd = -1;
    // close() can report deferred write errors (NFS, quota), so it is checked too.
    if (rc != 0) throw RunError(concat("closing ", path, " failed: ", errno_str(errno)));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw RunError(concat("renaming ", tmp, " to ", path, " failed: ", errno_str(errno)));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_parent_dir(path);
  return written;
}

HeldFile write_file_atomic(const std::string& path, const std::string& text) {
  return write_file_atomic(path, [&](int fd) { write_all(fd, text.data(), text.size(), path); });
}

bool remove_if_same(const std::string& path, const HeldFile& file) {
  if (!file.held()) return false;
  const FileId& id = file.id();
  // Checking the name and then unlinking it would remove a file renamed over it in between.
  // rename() takes whatever the name holds at one instant; what it took is then checked at leisure.
  // The aside name must name nothing: a leftover may be a link to this very file, and rename()
  // between two links to one file does nothing.
  const std::string doing = concat("cannot remove ", path);
  int error = 0;
  const std::string aside = first_free_temp(path, doing, &error, [&](const std::string& tmp) {
    return rename_no_replace(path, tmp) ? 0 : errno;
  });
  if (aside.empty()) {
    if (error == ENOENT) return false;
    throw RunError(concat(doing, ": moving it aside failed: ", errno_str(error)));
  }
  const std::optional<FileId> took = file_id(aside);
  if (took && *took == id) {
    ::unlink(aside.c_str());
    fsync_parent_dir(path);
    return true;
  }
  // Another writer's file: back under its name, unless a newer one has been written there since
  // (link() never replaces a name; rename() would).
  if (::link(aside.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    const int e = errno;
    if (e != EPERM && e != ENOTSUP && e != EOPNOTSUPP)
      throw RunError(concat("moved ", path, " aside to ", aside,
                            " and cannot put it back: ", errno_str(e), "; rename it back by hand"));
    // A filesystem without hard links: rename it back (a newer file there is then replaced by
    // this one, which an actcap merge repairs).
    if (::rename(aside.c_str(), path.c_str()) != 0)
      throw RunError(concat("moved ", path, " aside to ", aside, " and cannot put it back: ",
                            errno_str(errno), "; rename it back by hand"));
    return false;
  }
  ::unlink(aside.c_str());
  fsync_parent_dir(path);
  return false;
}

}  // namespace actcap
