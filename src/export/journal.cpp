#include "export/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "io/atomic_file.h"
#include "io/text_file.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
std::string entry_checksum(const json& shard) {
  const std::string canonical = shard.dump();
  return hex64(xxh3(canonical.data(), canonical.size()));
}
}  // namespace

std::vector<std::string> merge_journal(const std::string& dir, json& shards) {
  const std::string path = (fs::path(dir) / kJournalName).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  std::string text;
  try {
    text = read_text_file(path, kMaxManifestBytes, "manifest journal");
  } catch (const Error& e) {
    return {e.what()};
  }
  std::set<std::string> known;
  for (const json& s : shards)
    if (s.is_object() && s.contains("file") && s["file"].is_string())
      known.insert(s["file"].get<std::string>());
  size_t begin = 0;
  for (int64_t line_no = 1;; ++line_no) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;  // what follows the last newline is an unfinished append
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    json e;
    try {
      e = json::parse(line);
    } catch (const json::exception&) {
    }
    if (!e.is_object() || !e.contains("shard") || !e["shard"].is_object() || !e.contains("xxh3") ||
        e["xxh3"] != entry_checksum(e["shard"]))
      return {
          concat("line ", line_no,
                 " is damaged (it does not match its own checksum); nothing after it is claimed")};
    const json& shard = e["shard"];
    const std::string file = shard.value("file", "");
    if (known.count(file)) {
      bool same = false;
      for (const json& s : shards) same = same || s == shard;
      if (!same)
        return {concat("line ", line_no, " claims ", file, " differently from ", kManifestName)};
      continue;
    }
    known.insert(file);
    shards.push_back(shard);
  }
  return {};
}

JournalWriter::JournalWriter(std::string dir) : path_((fs::path(dir) / kJournalName).string()) {}

JournalWriter::~JournalWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JournalWriter::append(const json& shard) {
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) throw RunError(concat("cannot open ", path_, ": ", std::strerror(errno)));
    fsync_parent_dir(path_);  // the journal's own name must survive a crash too
  }
  const std::string line = json{{"shard", shard}, {"xxh3", entry_checksum(shard)}}.dump() + "\n";
  write_all(fd_, line.data(), line.size(), path_);
  if (::fdatasync(fd_) != 0)
    throw RunError(concat("syncing ", path_, " failed: ", std::strerror(errno)));
}

void JournalWriter::remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::error_code ec;
  if (fs::remove(path_, ec)) fsync_parent_dir(path_);
}

}  // namespace actcap
