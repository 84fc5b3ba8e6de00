// Bounded reads of small text files (config.json, index files, tokenizer.json, manifests, device
// maps) and of corpus lines: a hostile or mistaken input can make actcap allocate at most the
// stated limit, never "whatever the file says".
#pragma once

#include <cstdint>
#include <istream>
#include <string>

namespace actcap {

constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;      // config.json, device maps
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;       // model.safetensors.index.json
constexpr uint64_t kMaxTokenizerBytes = uint64_t{512} << 20;  // tokenizer.json (Llama 3's is 9 MB)
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;     // manifest.json of a long extract
constexpr uint64_t kMaxLineBytes = uint64_t{256} << 20;       // one corpus document

// The whole file; InputError naming `path` and `what` when it cannot be read or is over `limit`.
std::string read_text_file(const std::string& path, uint64_t limit, const char* what);

// std::getline with a bound: false at end of input; InputError naming `origin` and the line
// number when a line is longer than `limit` bytes (the rest of that line is not buffered).
bool read_line_bounded(std::istream& in, std::string& line, uint64_t limit,
                       const std::string& origin, int64_t line_number);

}  // namespace actcap
