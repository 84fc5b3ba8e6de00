#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "actcap/error.h"
#include "util/stage_timer.h"

namespace actcap {

namespace {
std::string errno_str(int e) { return std::strerror(e); }

FileId id_of(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
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

std::string temp_name_for(const std::string& path) { return concat(path, ".tmp.", ::getpid()); }

std::string temp_target(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0 || at + 5 == name.size()) return name;
  for (size_t i = at + 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return name;
  return name.substr(0, at);
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
  // Same folder as the target so that rename() is atomic; the pid keeps concurrent writers from
  // clobbering each other's temp files.
  const std::string tmp = temp_name_for(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw RunError(
        concat("cannot write ", path, ": creating ", tmp, " failed: ", errno_str(errno)));
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
  const std::string aside = temp_name_for(path);
  if (::rename(path.c_str(), aside.c_str()) != 0) {
    if (errno == ENOENT) return false;
    throw RunError(
        concat("cannot remove ", path, ": moving it to ", aside, " failed: ", errno_str(errno)));
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
