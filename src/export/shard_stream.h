// A shard written as its batches complete (extract, when a shard's rows come out of the forward
// already in (document line, position) order): every batch's rows go to their final offsets in the
// shard's temp file while the next batches run, the header (which holds the checksums) last; then,
// as write_checked_file() does, fsync, rename, folder fsync and a read-back checked exactly as
// verify checks, before the shard can be claimed. The data goes through O_DIRECT where the
// filesystem takes it (no page-cache pages to fill and fault in), and the read-back reads the disk
// the same way, chunk by chunk, instead of mapping the file.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actcap/hash.h"
#include "actcap/hooks.h"
#include "export/faults.h"
#include "export/shard.h"

namespace actcap {

// Writes the bytes of a file of known size at any offsets, each byte exactly once, through
// O_DIRECT when the filesystem allows it: whole aligned blocks of a 4 KiB-aligned source go to
// disk as they are; the rest collects in block buffers, each written once it is filled (the last
// block padded, the file cut to its size when closed). Without O_DIRECT (or with
// ACTCAP_DIRECT_IO=0) plain pwrite(). The file is a new temp file for `target`
// (create_temp_for, io/atomic_file.h), named by path(). RunError names it on any failure.
class BlockFile {
 public:
  static constexpr size_t kBlock = 4096;
  BlockFile(const std::string& target, uint64_t size);
  ~BlockFile();  // closes (never removes) the file
  const std::string& path() const { return path_; }
  BlockFile(const BlockFile&) = delete;
  BlockFile& operator=(const BlockFile&) = delete;
  void put(uint64_t offset, const void* src, size_t n);
  // Every byte written: cuts the file to its size, fsyncs and closes it.
  void close_synced();
  bool direct() const { return direct_; }

 private:
  struct Pending {
    uint8_t* buf = nullptr;
    size_t filled = 0;
  };
  void write_at(const void* src, size_t n, uint64_t offset);
  std::string path_;
  uint64_t size_;
  int fd_ = -1;
  bool direct_ = false;
  std::map<uint64_t, Pending> pending_;  // by block index
};

// One batch's rows of one point: contiguous CPU rows with the capture's fingerprint of them
// (chunked_xxh3, actcap/hash.h).
struct CapturedRows {
  at::Tensor rows;
  uint64_t fingerprint = 0;
};

class StreamedShard {
 public:
  // Shard `index` of `rows` rows, named `file` in `dir`: one tensor per point of `plan` ([rows,
  // ...shape], its dtype), then __rows__.seq, __rows__.pos, __rows__.token; the same header and
  // bytes write_checked_file() writes for those tensors. Creates the temp file.
  StreamedShard(const std::string& dir, const std::string& file, int64_t index,
                const std::vector<PointInfo>& plan, int64_t rows, const ShardSchema& schema,
                FaultPoints* faults);
  ~StreamedShard();  // an unfinished shard's temp file is removed
  StreamedShard(const StreamedShard&) = delete;
  StreamedShard& operator=(const StreamedShard&) = delete;

  // The next batch's rows of every point, in plan order. Each point's bytes are copied out to
  // their place in the file chunk by chunk, feeding the point's checksum and, right after, the
  // part's fingerprint from the copied bytes. Returns the first point (plan index) whose copy
  // does not match its capture fingerprint (nothing of that batch is then written), or -1.
  int add_batch(const std::vector<CapturedRows>& parts);
  int64_t rows_done() const { return done_; }
  int64_t batches() const { return batches_; }

  // After the last batch: writes the row-index tensors and the header, syncs and renames the
  // file, reads it back and checks it as verify does. Returns the shard's manifest entry (as
  // write_checked_file); RunError (file removed) when it does not read back as written.
  nlohmann::json finish(const std::vector<int64_t>& row_line, const std::vector<int64_t>& row_pos,
                        const std::vector<int64_t>& row_token);

 private:
  std::string dir_, file_, path_, tmp_;
  int64_t index_, rows_;
  const ShardSchema& schema_;
  FaultPoints* faults_;
  std::vector<PointInfo> plan_;
  std::vector<std::pair<std::string, at::Tensor>> layout_;  // dtypes and shapes only
  std::vector<uint64_t> offsets_;                           // each tensor's file offset
  std::vector<int64_t> row_bytes_;
  std::vector<std::unique_ptr<Xxh3Stream>> sums_;
  size_t prefix_size_ = 0;
  std::unique_ptr<BlockFile> out_;
  uint8_t* staging_ = nullptr;
  size_t staging_size_ = 0;
  int64_t done_ = 0, batches_ = 0;
  bool finished_ = false;
};

// Reads `path` back (O_DIRECT where it can, chunk by chunk) and checks it against `entry` and
// `schema` as check_shard() does.
std::vector<VerifyIssue> read_back_shard(const std::string& path, const std::string& file,
                                         const nlohmann::json& entry, const ShardSchema& schema);

}  // namespace actcap
