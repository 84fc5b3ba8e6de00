#include "export/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

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

namespace {

// One whole journal line's shard entry; nullopt with `problem` when the line is damaged.
std::optional<json> journal_entry(const char* begin, const char* end, int64_t line_no,
                                  std::string& problem) {
  json e = json::parse(begin, end, nullptr, /*allow_exceptions=*/false);
  if (!e.is_object() || !e.contains("shard") || !e["shard"].is_object() || !e.contains("xxh3") ||
      e["xxh3"] != entry_checksum(e["shard"])) {
    problem = concat("line ", line_no,
                     " is damaged (it does not match its own checksum); nothing after it is "
                     "claimed");
    return std::nullopt;
  }
  if (!e["shard"].contains("file") || !e["shard"]["file"].is_string()) {
    problem = concat("line ", line_no, " names no shard file");
    return std::nullopt;
  }
  return std::move(e["shard"]);
}

// The entry against what is already claimed: new (true, and now known), the same (false), or a
// different claim on the same file (`problem`).
bool claim(KnownEntries& known, const json& shard, int64_t line_no, std::string& problem) {
  const std::string file = shard["file"].get<std::string>();
  const uint64_t h = entry_xxh3(shard);
  const auto [it, added] = known.emplace(xxh3(file.data(), file.size()), h);
  if (!added && it->second != h)
    problem = concat("line ", line_no, " claims ", file, " differently from ", kManifestName);
  return added;
}

}  // namespace

uint64_t entry_xxh3(const json& shard) {
  const std::string dumped = shard.dump();
  return xxh3(dumped.data(), dumped.size());
}

void know(KnownEntries& known, const json& shard) {
  const std::string& file = shard["file"].get_ref<const std::string&>();
  known.emplace(xxh3(file.data(), file.size()), entry_xxh3(shard));
}

std::vector<std::string> merge_journal_text(const std::string& text, json& shards) {
  if (!shards.is_array()) return {concat(kManifestName, " has no shard list")};
  KnownEntries known;
  for (const json& s : shards)
    if (s.is_object() && s.contains("file") && s["file"].is_string()) know(known, s);
  size_t begin = 0;
  for (int64_t line_no = 1;; ++line_no) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;  // what follows the last newline is an unfinished append
    std::string problem;
    std::optional<json> shard =
        journal_entry(text.data() + begin, text.data() + end, line_no, problem);
    begin = end + 1;
    if (shard && claim(known, *shard, line_no, problem) && problem.empty())
      shards.push_back(std::move(*shard));
    if (!problem.empty()) return {problem};
  }
  return {};
}

std::vector<std::string> stream_journal(const std::string& dir, const std::string& file,
                                        KnownEntries* known,
                                        const std::function<void(const json&)>& on_entry) {
  const std::string path = (fs::path(dir) / file).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  if (fs::file_size(path, ec) > kMaxStreamedManifestBytes)
    return {concat(path, " is larger than the ", kMaxStreamedManifestBytes,
                   " bytes a journal may hold")};
  std::ifstream in(path, std::ios::binary);
  if (!in) return {concat(path, " cannot be read")};
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (in.eof()) break;  // no newline after it: an unfinished append
    std::string problem;
    std::optional<json> shard =
        journal_entry(line.data(), line.data() + line.size(), line_no, problem);
    if (shard && (!known || claim(*known, *shard, line_no, problem)) && problem.empty())
      on_entry(*shard);
    if (!problem.empty()) return {problem};
  }
  if (in.bad()) return {concat(path, ": read error")};
  return {};
}

EntrySource journal_entries(std::string dir, std::string file) {
  return [dir = std::move(dir), file = std::move(file)](const EntryVisitor& each) {
    for (const std::string& p : stream_journal(dir, file, nullptr, each))
      throw RunError(concat((fs::path(dir) / file).string(), ": ", p));
  };
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
