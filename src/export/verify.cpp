// `actcap verify` (and --resume's check): everything an output folder claims, against what a
// reader would decode from it.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "export/journal.h"
#include "export/layout.h"
#include "export/manifest.h"
#include "export/merge.h"
#include "export/shard.h"
#include "io/text_file.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name != "." && name != "..";
}

// Adds an issue, its kind from the file it names.
void add_issue(VerifyReport& r, const std::string& file, const std::string& tensor,
               const std::string& problem) {
  const std::optional<RankFile> rank = parse_rank_file(file);
  const bool journal = file == kJournalName || (rank && rank->journal);
  const bool manifest = file == kManifestName || (rank && !rank->journal);
  const VerifyIssue::Kind kind = manifest  ? VerifyIssue::Kind::kManifest
                                 : journal ? VerifyIssue::Kind::kJournal
                                           : VerifyIssue::Kind::kShard;
  r.issues.push_back({file, tensor, problem, kind});
}

// One file of the run, opened and checked against its entry and the schema.
void check_file(const std::string& dir, const std::string& file, const json& entry,
                const ShardSchema& schema, VerifyReport& r) {
  ++r.shards;
  std::shared_ptr<SafetensorsFile> st;
  try {
    st = SafetensorsFile::open((fs::path(dir) / file).string());
  } catch (const Error& e) {
    add_issue(r, file, "", e.what());
    return;
  }
  r.bytes += st->file_size();
  r.tensors += static_cast<int64_t>(st->tensors().size());
  for (VerifyIssue& i : check_shard(*st, file, entry, schema)) r.issues.push_back(std::move(i));
}

// Checks each claimed entry as it streams by: a well-formed entry naming a plain file, which opens
// and holds what its entry and the schema say; across shards (extract), document lines strictly
// increase from shard to shard (each shard holds whole documents, in order, whichever rank wrote
// it), and a complete run's rows add up.
class ShardChecker {
 public:
  ShardChecker(std::string dir, const ShardSchema& schema, VerifyReport& r, std::string manifest)
      : dir_(std::move(dir)), schema_(schema), r_(r), manifest_(std::move(manifest)) {}

  void check(const json& shard) {
    const bool named = shard.is_object() && shard.contains("file") && shard["file"].is_string();
    ++r_.claimed;
    order(shard);
    if (!named) {
      add_issue(r_, kManifestName, "", "malformed shard entry");
      return;
    }
    const std::string file = shard["file"].get<std::string>();
    if (!plain_file_name(file)) {
      add_issue(r_, kManifestName, "",
                concat("shard name '", file, "' is not a plain file name inside the folder"));
      return;
    }
    check_file(dir_, file, shard, schema_, r_);
  }

  void check_rows(const json& manifest, bool complete) {
    if (complete && rows_known_ && manifest.contains("rows") &&
        manifest["rows"].is_number_integer() && manifest["rows"].get<int64_t>() != rows_)
      add_issue(
          r_, manifest_, "",
          concat("claims ", manifest["rows"].get<int64_t>(), " rows but its shards hold ", rows_));
  }

 private:
  void order(const json& s) {
    if (!s.is_object()) return;
    if (s.contains("rows") && s["rows"].is_number_integer())
      rows_ += s["rows"].get<int64_t>();
    else
      rows_known_ = false;
    if (!s.contains("first_line") || !s["first_line"].is_number_integer() ||
        !s.contains("last_line") || !s["last_line"].is_number_integer())
      return;
    const int64_t first = s["first_line"].get<int64_t>(), end = s["last_line"].get<int64_t>();
    const std::string file = s.value("file", "?");
    if (first > end || first <= last_)
      add_issue(
          r_, manifest_, "",
          concat("shard ", file, " holds lines ", first, "..", end,
                 last_file_.empty() ? std::string()
                                    : concat(", not after ", last_file_, "'s last line ", last_),
                 ": the shards are out of order or overlap"));
    last_ = std::max(last_, end);
    last_file_ = file;
  }

  std::string dir_;
  const ShardSchema& schema_;
  VerifyReport& r_;
  std::string manifest_;
  int64_t last_ = -1, rows_ = 0;
  bool rows_known_ = true;
  std::string last_file_;
};

}  // namespace

namespace {

// The folder as `layout`'s writer left it: its manifest (streamed: the shard list is never held),
// then, while the run is unfinished, its journal; every claimed shard checked. `claimed`, when
// given, is handed every claimed entry (what --resume continues from).
VerifyReport verify_folder(const std::string& dir, const OutputLayout& layout,
                           const EntryVisitor* claimed) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(concat(dir, " is not a folder"));
  VerifyReport r;
  const std::string name = layout.manifest();
  const std::string path = (fs::path(dir) / name).string();
  if (!fs::exists(path, ec)) {
    const auto ranks = rank_manifests(dir);
    if (name == kManifestName && !ranks.empty()) {
      const auto& [world, have] = *ranks.rbegin();
      add_issue(r, name, "",
                concat("missing: the ", have.size(), " of ", world,
                       " rank manifests here are not assembled (docs/scale.md); run actcap "
                       "merge on the folder once every rank has finished, or resume the "
                       "unfinished ranks"));
    } else {
      add_issue(r, name, "", "missing: nothing in this folder is claimed complete");
    }
    return r;
  }
  std::string problem;
  ManifestFile held(path);  // a running rank may replace it: both passes read one version
  std::optional<json> parsed = held.outline(problem);
  if (!parsed) {
    add_issue(r, name, "", problem);
    return r;
  }
  const json& m = *parsed;
  if (!m.is_object() || !m.contains("manifest_checksum") || !m["manifest_checksum"].is_string()) {
    add_issue(r, name, "", "has no manifest_checksum");
    return r;
  }
  const size_t seal_at = r.issues.size();
  const auto seal = [&](bool sealed) {
    if (!sealed)
      r.issues.insert(
          r.issues.begin() + static_cast<std::ptrdiff_t>(seal_at),
          {name, "", "contents do not match manifest_checksum (the manifest was altered)",
           VerifyIssue::Kind::kManifest});
  };
  const bool complete = m.contains("complete") && m["complete"] == true;
  if (!complete)
    r.issues.push_back({name, "", "run is not marked complete", VerifyIssue::Kind::kIncomplete});
  // An assembled manifest.json records the bytes of the rank manifests it was built from: a rank
  // that ran again since (its assembler killed before it looked again) leaves it stale.
  if (name == kManifestName)
    for (const std::string& file : stale_rank_manifests(dir, m))
      add_issue(r, name, "",
                concat("assembled from another version of ", file,
                       " (a rank ran again); run actcap merge once every rank has finished"));
  std::optional<ShardSchema> schema;
  if (!m.contains("shards") || !m["shards"].is_array())
    problem = "has no shard list";
  else
    schema = shard_schema(m, problem);
  if (!schema) {  // the entries cannot be checked; the seal still can
    add_issue(r, name, "", problem);
    if (m.contains("shards") && m["shards"].is_array())
      seal(held.entries(m, [](const json&) {}));
    else
      seal(manifest_sealed(m));
    return r;
  }
  ShardChecker checker(dir, *schema, r, name);
  const bool journal = !complete && fs::exists(fs::path(dir) / layout.journal(), ec);
  KnownEntries known;  // the manifest's entries, for the journal's claims
  try {
    seal(held.entries(m, [&](const json& e) {
      if (journal && e.is_object() && e.contains("file") && e["file"].is_string()) know(known, e);
      if (claimed) (*claimed)(e);
      checker.check(e);
    }));
  } catch (const json::exception& e) {  // changed between the two passes
    add_issue(r, name, "", concat("not valid JSON (", e.what(), ")"));
    return r;
  }
  if (journal)  // an unfinished extract claims shards in its journal
    for (const std::string& p : stream_journal(dir, layout.journal(), &known, [&](const json& e) {
           if (claimed) (*claimed)(e);
           checker.check(e);
         }))
      add_issue(r, layout.journal(), "", p);
  checker.check_rows(m, complete);
  // A complete run with statistics lists their merged file (docs/stats.md); a rank's are merged
  // with the others' when manifest.json is assembled.
  if (complete && schema->stats && !layout.ranked()) {
    const json& st = m["stats"];
    if (!st.is_object() || !st.contains("file") || st["file"] != kStatsFileName) {
      add_issue(r, name, "", concat("the run's statistics list no ", kStatsFileName));
    } else {
      check_file(dir, kStatsFileName, st, stats_file_schema(*schema), r);
      --r.shards;  // a file of the run, not a shard of rows
    }
  }
  return r;
}

}  // namespace

VerifyReport verify_output(const std::string& dir) { return verify_folder(dir, {}, nullptr); }

VerifyReport verify_output(const std::string& dir, const OutputLayout& layout,
                           const EntryVisitor& on_claimed) {
  return verify_folder(dir, layout, &on_claimed);
}

}  // namespace actcap
