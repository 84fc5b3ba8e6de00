#include "io/atomic_file.h"

#include <fcntl.h>
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
}  // namespace

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

void write_file_atomic(const std::string& path, const std::function<void(int fd)>& write_body) {
  // Same folder as the target so that rename() is atomic; the pid keeps concurrent writers from
  // clobbering each other's temp files.
  const std::string tmp = temp_name_for(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw RunError(
        concat("cannot write ", path, ": creating ", tmp, " failed: ", errno_str(errno)));
  try {
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
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](int fd) { write_all(fd, text.data(), text.size(), path); });
}

}  // namespace actcap
