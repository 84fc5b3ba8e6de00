// safetensors reader and writer, following https://github.com/huggingface/safetensors exactly:
//   [u64 little-endian N][N bytes of JSON header][data section]
// The header is validated completely before any tensor is handed out (see validate rules in
// safetensors.cpp). Malformed files raise InputError naming the file and the tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace actcap {

// Largest header we accept, as the reference implementation (MAX_HEADER_SIZE).
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct TensorInfo {
  std::string name;
  std::string dtype_name;  // as written in the file: "F32", "BF16", ...
  c10::ScalarType dtype;   // LibTorch dtype
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets relative to the start of the data section
  uint64_t end = 0;    // one past the last byte
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;              // sorted by begin offset
  std::map<std::string, std::string> metadata;  // __metadata__ (string to string only)
  uint64_t data_offset = 0;                     // 8 + N: where the data section starts
};

// Parses and validates a complete safetensors file image held in memory. `origin` names the file
// in error messages. Checks: header length within the file and the limit, header is a JSON object
// starting with '{', entries have exactly dtype/shape/data_offsets of the right JSON types, known
// dtype names, non-negative dims, numel x itemsize == end - begin (no overflow), offsets inside the
// data section, no overlaps, no holes, data section fully covered, no duplicate names,
// __metadata__ values all strings.
SafetensorsHeader parse_safetensors(const uint8_t* data, uint64_t size, const std::string& origin);

// Maps a safetensors dtype name to LibTorch; throws InputError for unknown or unsupported names.
c10::ScalarType safetensors_dtype(const std::string& name, const std::string& origin);
// Inverse of safetensors_dtype; throws InputError for types safetensors cannot represent.
std::string safetensors_dtype_name(c10::ScalarType t);

// A memory-mapped, validated safetensors file. Tensors returned by tensor() keep the mapping alive
// (they hold a shared_ptr to the file, hence enable_shared_from_this).
class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent

  // CPU tensor over the mapped bytes when they are aligned for the dtype and to `alignment` bytes
  // (zero-copy, read-only: do not write into it), else an owned copy (64-byte aligned), after
  // which the mapped pages only it covered are released so they are not resident twice. Throws
  // InputError when the name is absent.
  at::Tensor tensor(const std::string& name, size_t alignment = 1) const;
  // Raw bytes of a tensor inside the mapping.
  const uint8_t* data(const TensorInfo& info) const {
    return base_ + header_.data_offset + info.begin;
  }
  uint64_t file_size() const { return size_; }
  const uint8_t* file_bytes() const { return base_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;
};

// Serialises tensors to the safetensors byte layout: header with `__metadata__` (always including
// "format": "pt"), padded with spaces to a multiple of 8, tensors back to back in the given order.
// Tensors may live anywhere; they are written as contiguous CPU little-endian bytes.
std::string safetensors_header_json(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata);

// The file's first bytes: the u64 header length, then safetensors_header_json(). What a shard's
// header checksum covers.
std::string safetensors_prefix(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata);
// Writes the data section (every tensor's bytes, in order) to `fd`; RunError naming `path`.
void write_safetensors_data(int fd, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const std::string& path);

// Writes a safetensors file crash-safely: a temporary file beside `path`, fsync, rename, fsync of
// the directory. On any failure the temporary file is removed and RunError names the path.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace actcap
