#include "export/manifest.h"

#include <filesystem>
#include <fstream>
#include <utility>

#include "actcap/error.h"
#include "actcap/hash.h"
#include "io/atomic_file.h"
#include "io/text_file.h"
#include "util/strings.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

EntryTally::EntryTally() : sum_(std::make_unique<Xxh3Stream>()) {}
EntryTally::~EntryTally() = default;
EntryTally::EntryTally(EntryTally&&) noexcept = default;
EntryTally& EntryTally::operator=(EntryTally&&) noexcept = default;

void EntryTally::add(const json& entry) {
  const std::string d = entry.dump();
  const uint64_t size = d.size();  // framed, so that entries cannot trade bytes
  sum_->update(&size, sizeof(size));
  sum_->update(d.data(), d.size());
  ++count_;
}

uint64_t EntryTally::digest() const { return sum_->digest(); }

namespace {

// XXH3 of the manifest without its manifest_checksum field, dumped canonically: what sealing
// writes and verifying recomputes.
std::string manifest_checksum(json manifest) {
  manifest.erase("manifest_checksum");
  const std::string canonical = manifest.dump();
  return hex64(xxh3(canonical.data(), canonical.size()));
}

// The text of `outline` dumped (indent < 0: canonically) with its shard list cut out: the list
// goes between `before` and `after`.
struct ListSplit {
  std::string before, after;
};
ListSplit split_at_list(json outline, int indent) {
  // A placeholder no other string of the document holds (a hostile one might hold the first).
  std::string mark =
      "\x01"
      "actcap shard list"
      "\x01";
  for (;;) {
    outline["shards"] = mark;
    const std::string text = outline.dump(indent);
    const std::string dumped = json(mark).dump();
    const size_t at = text.find(dumped);
    if (text.find(dumped, at + 1) == std::string::npos)
      return {text.substr(0, at), text.substr(at + dumped.size())};
    mark += '\x01';
  }
}

// The nlohmann callback that takes the elements of the top-level "shards" array out of the
// document as they complete, handing each to `take`.
json::parser_callback_t shard_taker(std::string& key, const std::function<void(json&)>& take) {
  return [&key, take](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key) {
      key = parsed.is_string() ? parsed.get<std::string>() : std::string();
      return true;
    }
    const bool element = event == json::parse_event_t::object_end ||
                         event == json::parse_event_t::array_end ||
                         event == json::parse_event_t::value;
    if (depth == 2 && element && key == "shards") {
      take(parsed);
      return false;  // not kept
    }
    return true;
  };
}

}  // namespace

ManifestFile::ManifestFile(std::string path) : path_(std::move(path)) {
  // The file's identity as named before and after opening it: equal, it is the file held open.
  const auto before = file_id(path_);
  in_.open(path_, std::ios::binary);
  if (before && in_ && before == file_id(path_)) id_ = before;
}

bool ManifestFile::replaced() const { return id_ && file_id(path_) != id_; }

std::optional<uint64_t> ManifestFile::bytes_xxh3() {
  if (!in_.is_open()) return std::nullopt;
  in_.clear();
  in_.seekg(0);
  Xxh3Stream sum;
  std::string buf(size_t{1} << 20, '\0');
  while (in_) {
    in_.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    sum.update(buf.data(), static_cast<size_t>(in_.gcount()));
  }
  if (!in_.eof()) return std::nullopt;
  in_.clear();
  return sum.digest();
}

std::optional<json> ManifestFile::outline(std::string& problem, const EntryVisitor& on_entry) {
  if (!in_) {
    problem = "cannot be read";
    return std::nullopt;
  }
  // The size of the file held open (the path may name a newer one by now).
  in_.seekg(0, std::ios::end);
  const std::streamoff size = in_.tellg();
  in_.seekg(0);
  if (size < 0 || static_cast<uint64_t>(size) > kMaxStreamedManifestBytes) {
    problem =
        concat("is larger than the ", kMaxStreamedManifestBytes, " bytes a manifest may hold");
    return std::nullopt;
  }
  std::string key;
  try {
    return json::parse(in_, shard_taker(key, [&on_entry](json& entry) {
                         if (on_entry) on_entry(entry);
                       }));
  } catch (const json::exception& e) {
    problem = concat("not valid JSON (", e.what(), ")");
    return std::nullopt;
  }
}

bool ManifestFile::entries(const json& outline, const EntryVisitor& on_entry) {
  json unsealed = outline;
  unsealed.erase("manifest_checksum");
  const ListSplit text = split_at_list(unsealed, -1);
  Xxh3Stream sum;
  sum.update(text.before.data(), text.before.size());
  sum.update("[", 1);
  int64_t n = 0;
  in_.clear();
  in_.seekg(0);
  std::string key;
  // The second pass's document must be the first's (the file was not edited in place between).
  const json again = json::parse(in_, shard_taker(key, [&](json& entry) {
                                   const std::string d = entry.dump();
                                   if (n++) sum.update(",", 1);
                                   sum.update(d.data(), d.size());
                                   on_entry(entry);
                                 }));
  if (again != outline)
    throw json::other_error::create(501, "the manifest changed while it was read", nullptr);
  sum.update("]", 1);
  sum.update(text.after.data(), text.after.size());
  return outline.contains("manifest_checksum") && outline["manifest_checksum"].is_string() &&
         outline["manifest_checksum"].get<std::string>() == hex64(sum.digest());
}

std::optional<json> manifest_outline(const std::string& path, std::string& problem,
                                     const EntryVisitor& on_entry) {
  return ManifestFile(path).outline(problem, on_entry);
}

bool stream_manifest_entries(const std::string& path, const json& outline,
                             const EntryVisitor& on_entry) {
  return ManifestFile(path).entries(outline, on_entry);
}

EntrySource manifest_entries(std::shared_ptr<ManifestFile> file, json outline) {
  return [file = std::move(file), outline = std::move(outline)](const EntryVisitor& each) {
    bool sealed = false;
    try {
      sealed = file->entries(outline, each);
    } catch (const json::exception& e) {
      throw RunError(concat(file->path(), " is not valid JSON (", e.what(), ")"));
    }
    if (!sealed)
      throw RunError(concat(file->path(),
                            " does not match its manifest_checksum (altered while the run "
                            "read it); run actcap verify"));
  };
}

EntrySource manifest_entries(std::string path, json outline) {
  // The path opened anew at every walk.
  return [path = std::move(path), outline = std::move(outline)](const EntryVisitor& each) {
    manifest_entries(std::make_shared<ManifestFile>(path), outline)(each);
  };
}

EntrySource in_turn(std::vector<EntrySource> sources) {
  return [sources = std::move(sources)](const EntryVisitor& each) {
    for (const EntrySource& s : sources) s(each);
  };
}

bool manifest_sealed(const json& manifest) {
  return manifest.is_object() && manifest.contains("manifest_checksum") &&
         manifest["manifest_checksum"].is_string() &&
         manifest["manifest_checksum"].get<std::string>() == manifest_checksum(manifest);
}

std::string seal_manifest(json manifest) {
  manifest["manifest_checksum"] = manifest_checksum(manifest);
  return manifest.dump(2) + "\n";
}

void write_manifest(const std::string& dir, const json& manifest, FaultPoints* faults,
                    const std::string& file) {
  const std::string path = (fs::path(dir) / file).string();
  const std::string text = seal_manifest(manifest);
  write_file_atomic(path, [&](int fd) {
    // In two halves, so that a test can stop the process with the temp file half written.
    const size_t half = text.size() / 2;
    write_all(fd, text.data(), half, path);
    if (faults) faults->reached(ExportFaults::Moment::kManifestWrite);
    write_all(fd, text.data() + half, text.size() - half, path);
  });
}

namespace {

// Buffered writes of the manifest's text.
class TextOut {
 public:
  TextOut(int fd, const std::string& path) : fd_(fd), path_(path) { buf_.reserve(kFlush + 4096); }
  std::string& buf() { return buf_; }
  void maybe_flush() {
    if (buf_.size() >= kFlush) flush();
  }
  void flush() {
    write_all(fd_, buf_.data(), buf_.size(), path_);
    buf_.clear();
  }

 private:
  static constexpr size_t kFlush = size_t{1} << 20;
  int fd_;
  const std::string& path_;
  std::string buf_;
};

// An entry as dump(2) prints it inside the top-level "shards" list: every line indented 4 more
// (raw newlines occur in dump(2)'s text only between tokens: strings escape theirs).
void append_listed(std::string& out, const json& entry) {
  out += "    ";
  for (const char c : entry.dump(2)) {
    out += c;
    if (c == '\n') out += "    ";
  }
}

}  // namespace

std::string write_manifest_streamed(const std::string& dir, const json& outline,
                                    const EntrySource& entries, const EntryTally* expected,
                                    FaultPoints* faults, const std::string& file,
                                    HeldFile* written) {
  const std::string path = (fs::path(dir) / file).string();
  json head = outline;
  head.erase("manifest_checksum");
  head["shards"] = json::array();

  // Pass one: the seal, over the canonical text.
  const ListSplit canon = split_at_list(head, -1);
  Xxh3Stream sum;
  sum.update(canon.before.data(), canon.before.size());
  sum.update("[", 1);
  EntryTally first;
  entries([&](const json& e) {
    const std::string d = e.dump();
    if (first.count()) sum.update(",", 1);
    sum.update(d.data(), d.size());
    first.add(e);
  });
  sum.update("]", 1);
  sum.update(canon.after.data(), canon.after.size());
  if (expected && !(first == *expected))
    throw RunError(concat(path, ": the shard list read back to write it (", first.count(),
                          " entries) is not the one the run checked and claimed (",
                          expected->count(), "); the manifest was not rewritten"));
  const std::string checksum = hex64(sum.digest());

  // Pass two: the text, dump(2) of the whole manifest.
  head["manifest_checksum"] = checksum;
  const ListSplit pretty = split_at_list(head, 2);
  HeldFile id = write_file_atomic(path, [&](int fd) {
    TextOut out(fd, path);
    out.buf() = pretty.before;
    const int64_t half = first.count() / 2;
    if (first.count() == 0) {
      out.buf() += "[]";
      out.flush();
      if (faults) faults->reached(ExportFaults::Moment::kManifestWrite);
    } else {
      out.buf() += "[\n";
    }
    EntryTally second;
    entries([&](const json& e) {
      if (second.count()) out.buf() += ",\n";
      append_listed(out.buf(), e);
      second.add(e);
      out.maybe_flush();
      if (second.count() == half + 1 && faults) {  // the temp file half written
        out.flush();
        faults->reached(ExportFaults::Moment::kManifestWrite);
      }
    });
    if (!(second == first))
      throw RunError(concat(path, ": the shard list changed while the manifest was written (",
                            first.count(), " entries, then ", second.count(),
                            "); the manifest was not rewritten"));
    if (first.count()) out.buf() += "\n  ]";
    out.buf() += pretty.after;
    out.buf() += "\n";
    out.flush();
  });
  if (written) *written = std::move(id);
  return checksum;
}

}  // namespace actcap
