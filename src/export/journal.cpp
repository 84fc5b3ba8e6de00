#include "export/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

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

std::vector<std::string> merge_journal(const std::string& dir, json& shards,
                                       const std::string& file) {
  const std::string path = (fs::path(dir) / file).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  std::string text;
  try {
    text = read_text_file(path, kMaxManifestBytes, "manifest journal");
  } catch (const Error& e) {
    return {e.what()};
  }
  return merge_journal_text(text, shards);
}

std::string journal_line(const json& shard) {
  return json{{"shard", shard}, {"xxh3", entry_checksum(shard)}}.dump() + "\n";
}

std::vector<std::string> merge_journal_text(const std::string& text, json& shards) {
  if (!shards.is_array()) return {concat(kManifestName, " has no shard list")};
  std::map<std::string, size_t> known;  // file -> its index in `shards`
  for (size_t i = 0; i < shards.size(); ++i)
    if (shards[i].is_object() && shards[i].contains("file") && shards[i]["file"].is_string())
      known.emplace(shards[i]["file"].get<std::string>(), i);
  size_t begin = 0;
  for (int64_t line_no = 1;; ++line_no) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;  // what follows the last newline is an unfinished append
    json e = json::parse(text.begin() + static_cast<std::ptrdiff_t>(begin),
                         text.begin() + static_cast<std::ptrdiff_t>(end), nullptr,
                         /*allow_exceptions=*/false);
    begin = end + 1;
    if (!e.is_object() || !e.contains("shard") || !e["shard"].is_object() || !e.contains("xxh3") ||
        e["xxh3"] != entry_checksum(e["shard"]))
      return {
          concat("line ", line_no,
                 " is damaged (it does not match its own checksum); nothing after it is claimed")};
    const json& shard = e["shard"];
    if (!shard.contains("file") || !shard["file"].is_string())
      return {concat("line ", line_no, " names no shard file")};
    const std::string file = shard["file"].get<std::string>();
    const auto it = known.find(file);
    if (it != known.end()) {
      if (shards[it->second] != shard)
        return {concat("line ", line_no, " claims ", file, " differently from ", kManifestName)};
      continue;
    }
    known.emplace(file, shards.size());
    shards.push_back(shard);
  }
  return {};
}

JournalWriter::JournalWriter(std::string dir, FaultPoints* faults, const std::string& file)
    : path_((fs::path(dir) / file).string()), faults_(faults) {}

JournalWriter::~JournalWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JournalWriter::append(const json& shard) {
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) throw RunError(concat("cannot open ", path_, ": ", std::strerror(errno)));
    fsync_parent_dir(path_);  // the journal's own name must survive a crash too
  }
  const std::string line = journal_line(shard);
  write_all(fd_, line.data(), line.size(), path_);
  if (::fdatasync(fd_) != 0)
    throw RunError(concat("syncing ", path_, " failed: ", std::strerror(errno)));
  if (faults_) faults_->reached(ExportFaults::Moment::kJournal);
}

void JournalWriter::remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::error_code ec;
  if (fs::remove(path_, ec)) fsync_parent_dir(path_);
}

}  // namespace actcap
