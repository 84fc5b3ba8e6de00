#include "export/shard_stream.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "actcap/error.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "io/atomic_file.h"
#include "util/stage_timer.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// ACTCAP_DIRECT_IO=0 keeps the page cache (for measuring; the files are the same).
bool direct_io_allowed() {
  const char* e = std::getenv("ACTCAP_DIRECT_IO");
  return !(e && std::string(e) == "0");
}

uint8_t* aligned_buffer(size_t n) {
  void* p = nullptr;
  if (::posix_memalign(&p, BlockFile::kBlock, std::max(n, BlockFile::kBlock)) != 0)
    throw std::bad_alloc();
  return static_cast<uint8_t*>(p);
}

// Turns O_DIRECT off on `fd` (a filesystem that took it at open but refuses an I/O); whether it
// could.
bool drop_direct(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  return fl >= 0 && ::fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0;
}

constexpr size_t kReadChunk = size_t{8} << 20;

}  // namespace

BlockFile::BlockFile(const std::string& target, uint64_t size) : size_(size) {
  fd_ = create_temp_for(target, O_WRONLY, &path_);
  // O_DIRECT set after the file is made, where the filesystem takes it: an open with O_DIRECT
  // can create the file and then refuse.
  if (direct_io_allowed()) {
    const int fl = ::fcntl(fd_, F_GETFL);
    direct_ = fl >= 0 && ::fcntl(fd_, F_SETFL, fl | O_DIRECT) == 0;
  }
}

BlockFile::~BlockFile() {
  for (auto& [block, p] : pending_) std::free(p.buf);
  if (fd_ >= 0) ::close(fd_);
}

void BlockFile::write_at(const void* src, size_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(src);
  while (n > 0) {
    const ssize_t w =
        ::pwrite(fd_, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    // The filesystem took O_DIRECT at open but not this write: carry on through the page cache.
    if (w < 0 && errno == EINVAL && direct_ && drop_direct(fd_)) {
      direct_ = false;
      continue;
    }
    if (w < 0) throw RunError(concat("writing ", path_, " failed: ", errno_text(errno)));
    if (w == 0) throw RunError(concat("writing ", path_, " failed: write returned 0"));
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

void BlockFile::put(uint64_t offset, const void* src, size_t n) {
  if (offset + n > size_)
    throw RunError(concat("writing ", path_, ": bytes [", offset, ", ", offset + n,
                          ") are past its size of ", size_, " (internal error)"));
  const auto* from = static_cast<const uint8_t*>(src);
  if (!direct_) {
    write_at(from, n, offset);
    return;
  }
  uint64_t pos = offset;
  const uint64_t end = offset + n;
  while (pos < end) {
    const uint64_t block = pos / kBlock, start = block * kBlock;
    const uint64_t block_end = std::min<uint64_t>(start + kBlock, size_);
    const uint8_t* at = from + (pos - offset);
    if (pos == start && start + kBlock <= end && reinterpret_cast<uintptr_t>(at) % kBlock == 0) {
      const uint64_t run_end = start + (end - start) / kBlock * kBlock;  // whole blocks
      write_at(at, run_end - start, start);
      pos = run_end;
      continue;
    }
    Pending& p = pending_[block];
    if (!p.buf) {
      p.buf = aligned_buffer(kBlock);
      std::memset(p.buf, 0, kBlock);
    }
    const uint64_t take = std::min(end, block_end) - pos;
    std::memcpy(p.buf + (pos - start), at, take);
    p.filled += take;
    pos += take;
    if (p.filled == block_end - start) {
      write_at(p.buf, kBlock, start);  // the last block padded: cut back in close_synced()
      std::free(p.buf);
      pending_.erase(block);
    }
  }
}

void BlockFile::close_synced() {
  if (!pending_.empty())
    throw RunError(concat("writing ", path_, ": block ", pending_.begin()->first,
                          " was never completed (internal error)"));
  if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0)
    throw RunError(concat("writing ", path_, " failed: ", errno_text(errno)));
  StageTimer fsync_timer("io.fsync");
  if (::fsync(fd_) != 0) throw RunError(concat("syncing ", path_, " failed: ", errno_text(errno)));
  fsync_timer.stop();
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw RunError(concat("closing ", path_, " failed: ", errno_text(errno)));
}

StreamedShard::StreamedShard(const std::string& dir, const std::string& file, int64_t index,
                             const std::vector<PointInfo>& plan, int64_t rows,
                             const ShardSchema& schema, FaultPoints* faults)
    : dir_(dir),
      file_(file),
      path_((fs::path(dir) / file).string()),
      index_(index),
      rows_(rows),
      schema_(schema),
      faults_(faults),
      plan_(plan) {
  json placeholder = json::object();  // checksums are 16 hex digits: the header's length is known
  for (const PointInfo& p : plan) {
    std::vector<int64_t> one{1}, shape{rows};
    one.insert(one.end(), p.shape.begin(), p.shape.end());
    shape.insert(shape.end(), p.shape.begin(), p.shape.end());
    layout_.emplace_back(p.name, at::empty(one, at::TensorOptions().dtype(p.dtype)).expand(shape));
  }
  for (const char* name : {"__rows__.seq", "__rows__.pos", "__rows__.token"})
    layout_.emplace_back(name, at::empty({1}, at::kLong).expand({rows}));
  for (const auto& [name, t] : layout_) placeholder[name] = hex64(0);
  std::string prefix;
  try {
    prefix = safetensors_prefix(layout_, shard_metadata(schema_, placeholder));
  } catch (const InputError& e) {
    throw InputError(concat("cannot write ", path_, ": ", e.what()));
  }
  prefix_size_ = prefix.size();
  uint64_t offset = prefix_size_;
  for (const auto& [name, t] : layout_) {
    offsets_.push_back(offset);
    const int64_t per_row = t.numel() / std::max<int64_t>(rows, 1) * t.element_size();
    row_bytes_.push_back(per_row);
    offset += static_cast<uint64_t>(t.numel()) * t.element_size();
  }
  for (size_t k = 0; k < plan.size(); ++k) sums_.push_back(std::make_unique<Xxh3Stream>());
  out_ = std::make_unique<BlockFile>(path_, offset);
  tmp_ = out_->path();
}

StreamedShard::~StreamedShard() {
  std::free(staging_);
  if (!finished_) {
    out_.reset();
    ::unlink(tmp_.c_str());
  }
}

int StreamedShard::add_batch(const std::vector<CapturedRows>& parts) {
  if (parts.size() != plan_.size())
    throw RunError(concat(file_, ": a batch brought ", parts.size(), " points, the plan has ",
                          plan_.size(), " (internal error)"));
  const int64_t rows = parts.empty() ? 0 : parts.front().rows.size(0);
  if (done_ + rows > rows_)
    throw RunError(
        concat(file_, ": batches bring more than the shard's ", rows_, " rows (internal error)"));
  const bool last = done_ + rows == rows_;
  const ExportFaults* f = faults_ ? &faults_->faults() : nullptr;
  for (size_t k = 0; k < parts.size(); ++k) {
    const at::Tensor& t = parts[k].rows;
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    if (!t.device().is_cpu() || !t.is_contiguous() || t.dim() < 1 || t.size(0) != rows ||
        t.scalar_type() != plan_[k].dtype ||
        n != static_cast<size_t>(rows) * static_cast<size_t>(row_bytes_[k]))
      throw RunError(concat(file_, ": the rows of '", plan_[k].name,
                            "' do not have the planned dtype and shape (internal error)"));
    if (last && k == 0 && f && names_shard(f->damage_assembled, index_))
      flip_last_byte(t);  // test-only: before the checksums are taken
    const uint64_t at = offsets_[k] + static_cast<uint64_t>(done_) * row_bytes_[k];
    const size_t phase = out_->direct() ? at % BlockFile::kBlock : 0;
    if (staging_size_ < phase + n) {
      std::free(staging_);
      staging_ = nullptr;
      staging_size_ = phase + n;
      staging_ = aligned_buffer(staging_size_);
    }
    uint8_t* dst = staging_ + phase;
    if (copy_stream_and_fingerprint(t.data_ptr(), dst, n, *sums_[k]) != parts[k].fingerprint)
      return static_cast<int>(k);
    if (last && k == 0 && f && names_shard(f->damage_queued, index_) && n > 0)
      dst[n - 1] ^= 0x01;  // test-only: after the checksums are taken, before it is written
    out_->put(at, dst, n);
  }
  done_ += rows;
  ++batches_;
  if (faults_ && batches_ == 1) faults_->reached(ExportFaults::Moment::kShardWrite);
  return -1;
}

json StreamedShard::finish(const std::vector<int64_t>& row_line,
                           const std::vector<int64_t>& row_pos,
                           const std::vector<int64_t>& row_token) {
  if (done_ != rows_ || static_cast<int64_t>(row_line.size()) != rows_ ||
      row_pos.size() != row_line.size() || row_token.size() != row_line.size())
    throw RunError(concat(file_, ": ", done_, " rows written of ", rows_, " (internal error)"));
  json checksums = json::object();
  for (size_t k = 0; k < plan_.size(); ++k) checksums[plan_[k].name] = hex64(sums_[k]->digest());
  const std::vector<int64_t>* index_rows[] = {&row_line, &row_pos, &row_token};
  for (size_t i = 0; i < 3; ++i) {
    const size_t k = plan_.size() + i;
    const size_t n = rows_ * sizeof(int64_t);
    checksums[layout_[k].first] = hex64(xxh3(index_rows[i]->data(), n));
    out_->put(offsets_[k], index_rows[i]->data(), n);
  }
  const std::string prefix = safetensors_prefix(layout_, shard_metadata(schema_, checksums));
  if (prefix.size() != prefix_size_)
    throw RunError(concat(file_, ": header of ", prefix.size(), " bytes, ", prefix_size_,
                          " reserved (internal error)"));
  out_->put(0, prefix.data(), prefix.size());
  {
    StageTimer sync_timer("writer.sync+rename");
    out_->close_synced();
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw RunError(concat("renaming ", tmp_, " to ", path_, " failed: ", errno_text(errno)));
    finished_ = true;  // from here on the file is path_, removed below if it is bad
    fsync_parent_dir(path_);
  }
  if (faults_ && names_shard(faults_->faults().damage_file, index_)) flip_last_byte(path_);
  const uint64_t bytes = offsets_.back() + rows_ * sizeof(int64_t);
  const json entry = {{"file", file_},
                      {"rows", rows_},
                      {"bytes", bytes},
                      {"header_xxh3", hex64(xxh3(prefix.data(), prefix.size()))},
                      {"checksums", checksums}};
  std::vector<VerifyIssue> problems;
  StageTimer readback_timer("writer.readback");
  try {
    problems = read_back_shard(path_, file_, entry, schema_);
  } catch (const Error& e) {
    problems.push_back({file_, "", e.what()});
  }
  readback_timer.stop();
  reject_unless_intact(path_, problems);
  return entry;
}

std::vector<VerifyIssue> read_back_shard(const std::string& path, const std::string& file,
                                         const json& entry, const ShardSchema& schema) {
  int fd = -1;
  if (direct_io_allowed()) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  bool direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(concat("cannot open ", path, ": ", errno_text(errno)));
  struct FdCloser {
    int fd;
    uint8_t* buf;
    ~FdCloser() {
      ::close(fd);
      std::free(buf);
    }
  } closer{fd, aligned_buffer(kReadChunk)};
  struct stat st;
  if (::fstat(fd, &st) != 0)
    throw InputError(concat("cannot stat ", path, ": ", errno_text(errno)));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint8_t* buf = closer.buf;
  uint64_t pos = 0;  // bytes read so far
  // Reads the next chunk into `buf`; returns its length (0 at the end).
  const auto next = [&]() -> size_t {
    size_t got = 0;
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kReadChunk, size - pos));
    while (got < want) {
      const ssize_t r = ::pread(fd, buf + got, kReadChunk - got, static_cast<off_t>(pos + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EINVAL && direct && drop_direct(fd)) {
        direct = false;
        continue;
      }
      if (r < 0) throw InputError(concat("reading ", path, " failed: ", errno_text(errno)));
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    if (got < want)
      throw InputError(concat(path, ": read ", pos + got, " bytes of ", size, " (file shrank?)"));
    pos += got;
    return got;
  };
  // The header: the first 8 bytes give its length.
  std::string prefix;
  size_t len = next(), used = 0;
  prefix.assign(reinterpret_cast<const char*>(buf), std::min<size_t>(len, 8));
  used = prefix.size();
  uint64_t want = 8;
  if (prefix.size() == 8) {
    uint64_t n = 0;
    std::memcpy(&n, prefix.data(), 8);
    if (n <= kMaxSafetensorsHeader && n <= size - 8) want = 8 + n;
  }
  while (prefix.size() < want) {
    if (used == len) {
      len = next();
      used = 0;
      if (len == 0) break;
    }
    const size_t take = std::min<size_t>(want - prefix.size(), len - used);
    prefix.append(reinterpret_cast<const char*>(buf + used), take);
    used += take;
  }
  const SafetensorsHeader header =
      parse_safetensors(reinterpret_cast<const uint8_t*>(prefix.data()), size, path);
  // The data section: every tensor's XXH3, fed chunk by chunk (tensors tile it, sorted by begin).
  std::vector<uint64_t> digests(header.tensors.size(), 0);
  size_t t = 0;
  Xxh3Stream stream;
  uint64_t data_pos = 0;  // offset within the data section of buf[used]
  const auto finish_tensors = [&] {
    while (t < header.tensors.size() && header.tensors[t].end <= data_pos) {
      digests[t] = stream.digest();
      stream.reset();
      ++t;
    }
  };
  finish_tensors();  // tensors of no bytes at the start
  for (;;) {
    while (used < len && t < header.tensors.size()) {
      const uint64_t left = header.tensors[t].end - data_pos;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(left, len - used));
      stream.update(buf + used, take);
      used += take;
      data_pos += take;
      finish_tensors();
    }
    if (pos >= size) break;
    len = next();
    used = 0;
  }
  std::map<std::string, uint64_t> by_name;
  for (size_t i = 0; i < header.tensors.size(); ++i) by_name[header.tensors[i].name] = digests[i];
  const ShardImage image{header, reinterpret_cast<const uint8_t*>(prefix.data()), size,
                         [&](const TensorInfo& info) { return by_name.at(info.name); }};
  return check_shard(image, file, entry, schema);
}

}  // namespace actcap
