// verify checks everything a reader decodes from an output folder: every bit of a shard's header,
// a sample of its data bytes, every byte of the manifest and of the journal. And extract's shard
// checksums follow from verified data: damage to the assembled rows before the checksums are
// taken, or to the queued rows after, is caught.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/extract.h"
#include "actcap/model.h"
#include "actcap/safetensors.h"
#include "export/shard.h"

using namespace actcap;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/actcap-verify-XXXXXX";
  return mkdtemp(tmpl);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A `run` output folder of the demo model: one point (plus the two row tensors), 5 rows.
std::string small_run_folder(const std::vector<std::string>& points = {"transformer.h.0"}) {
  auto m = Model::load("demo");
  SafeCapturer cap(*m, CaptureOptions{points});
  cap.run(Batch::from_sequences({{72, 101, 108}, {108, 111}}, m->config().vocab_size,
                                m->config().max_positions()));
  const std::string dir = temp_dir();
  export_run(dir, cap, *m);
  return dir;
}

bool names(const VerifyReport& r, const std::string& file) {
  for (const VerifyIssue& i : r.issues)
    if (i.file == file) return true;
  return false;
}

// What a reader decodes from a header: every tensor's name, dtype, shape and offsets, and the
// metadata. Two headers that decode the same are equivalent whatever their bytes.
std::string decoded(const SafetensorsHeader& h) {
  json out = json::object();
  for (const TensorInfo& t : h.tensors) out[t.name] = {t.dtype_name, t.shape, t.begin, t.end};
  out["__metadata__"] = h.metadata;
  return out.dump();
}

}  // namespace

// Every bit of the header (the u64 length and the JSON), flipped one at a time, makes verify fail
// naming the shard. The manifest's header_xxh3 alone catches each of them. The test then turns
// that check off and requires the field-by-field checks (dtype, shape, tensor set, metadata, file
// size, data checksums) to catch every flip that changes what a reader decodes; a flip whose
// decoded header is equal (same names, dtypes, shapes, offsets and metadata) may pass there.
// Fails without its defence: with the header_xxh3, dtype and shape comparisons in check_shard
// disabled, a flip of the header's padding (byte 454: ' ' -> NUL) passed verify, and the edits of
// DtypeAndShapeEditsAreNamed ("F32" -> "I32" read OK at a0db93b, before header checks) went unseen.
TEST(Verify, EveryBitFlipOfAShardHeaderIsCaught) {
  const std::string dir = small_run_folder();
  const std::string file = "shard-00000.safetensors", path = dir + "/" + file;
  const std::string bytes = read_file(path);
  ASSERT_TRUE(verify_output(dir).ok());
  const json manifest = json::parse(read_file(dir + "/manifest.json"));
  std::string problem;
  const ShardSchema schema = *shard_schema(manifest, problem);
  const json& entry = manifest["shards"][0];
  uint64_t header_end = 0;
  std::memcpy(&header_end, bytes.data(), 8);
  header_end += 8;
  const std::string original =
      decoded(parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x"));

  int flips = 0, refused_by_reader = 0, equivalent = 0;
  std::string equivalent_at;
  for (uint64_t at = 0; at < header_end; ++at)
    for (int bit = 0; bit < 8; ++bit) {
      std::string damaged = bytes;
      damaged[at] = static_cast<char>(damaged[at] ^ (1 << bit));
      write_file(path, damaged);
      ++flips;
      const VerifyReport r = verify_output(dir);
      ASSERT_TRUE(names(r, file)) << "byte " << at << " bit " << bit << " passed verify";

      std::shared_ptr<SafetensorsFile> st;
      try {
        st = SafetensorsFile::open(path);
      } catch (const InputError&) {
        ++refused_by_reader;  // no reader decodes it at all
        continue;
      }
      const auto fields = check_shard(*st, file, entry, schema, {/*header_checksum=*/false});
      if (fields.empty()) {
        ASSERT_EQ(decoded(st->header()), original)
            << "byte " << at << " bit " << bit
            << " changes what a reader decodes, and only the header checksum caught it";
        ++equivalent;
        equivalent_at += concat(" byte ", at, " bit ", bit, " ('", bytes[at], "' -> 0x", std::hex,
                                static_cast<int>(static_cast<uint8_t>(damaged[at])), std::dec, ")");
      }
    }
  write_file(path, bytes);
  EXPECT_TRUE(verify_output(dir).ok());
  EXPECT_EQ(flips, static_cast<int>(header_end) * 8);
  EXPECT_GT(refused_by_reader, 0);
  // Recorded for the report: how many flips decoded to an equivalent header.
  RecordProperty("header_bytes", static_cast<int>(header_end));
  RecordProperty("equivalent_flips", equivalent);
  std::cout << "header " << header_end << " bytes, " << flips << " flips: " << refused_by_reader
            << " refused by the reader, " << equivalent
            << " decode to an equivalent header (caught by header_xxh3 only:" << equivalent_at
            << "), the rest by the field checks too\n";
  fs::remove_all(dir);
}

// The edits from the bug report, made as a hostile or broken tool would make them (same length,
// so the file stays valid safetensors): each is named for what it is, with the header checksum and
// without it.
TEST(Verify, DtypeAndShapeEditsAreNamed) {
  const std::string dir = small_run_folder();
  const std::string path = dir + "/shard-00000.safetensors";
  const std::string bytes = read_file(path);
  const json manifest = json::parse(read_file(dir + "/manifest.json"));
  std::string problem;
  const ShardSchema schema = *shard_schema(manifest, problem);
  const json& entry = manifest["shards"][0];
  struct Edit {
    std::string from, to, expect;
  };
  for (const Edit& e :
       {Edit{"\"F32\"", "\"I32\"", "dtype I32 in the header, manifest says F32"},
        Edit{"[5,64]", "[64,5]", "shape [64,5] in the header, manifest says [5,64]"},
        Edit{"\"I64\"", "\"F64\"", "dtype F64 in the header, manifest says I64"}}) {
    std::string damaged = bytes;
    const size_t at = damaged.find(e.from);
    ASSERT_NE(at, std::string::npos) << e.from;
    damaged.replace(at, e.from.size(), e.to);
    write_file(path, damaged);
    const VerifyReport r = verify_output(dir);
    bool header = false, named = false;
    for (const VerifyIssue& i : r.issues) {
      header |= i.problem.find("header checksum") != std::string::npos;
      named |= i.problem.find(e.expect) != std::string::npos;
    }
    EXPECT_TRUE(header && named) << e.from << " -> " << e.to;
    const auto fields =
        check_shard(*SafetensorsFile::open(path), "s", entry, schema, {/*header_checksum=*/false});
    EXPECT_FALSE(fields.empty()) << e.from << " -> " << e.to;
  }
  write_file(path, bytes);
  fs::remove_all(dir);
}

// A sample of data bytes (every 13th, every bit position over the sample): each flip fails verify
// naming the shard and the tensor whose bytes hold it.
TEST(Verify, DataByteFlipsAreNamedByTensor) {
  const std::string dir = small_run_folder({"transformer.h.0", "transformer.h.1.mlp"});
  const std::string file = "shard-00000.safetensors", path = dir + "/" + file;
  const std::string bytes = read_file(path);
  const auto st = SafetensorsFile::open(path);
  const SafetensorsHeader header = st->header();
  int sampled = 0;
  for (uint64_t at = header.data_offset; at < bytes.size(); at += 13) {
    std::string damaged = bytes;
    damaged[at] = static_cast<char>(damaged[at] ^ (1 << (at % 8)));
    write_file(path, damaged);
    std::string holder;
    for (const TensorInfo& t : header.tensors)
      if (at - header.data_offset >= t.begin && at - header.data_offset < t.end) holder = t.name;
    bool named = false;
    for (const VerifyIssue& i : verify_output(dir).issues)
      named |= i.file == file && i.tensor == holder && i.problem.find("checksum") == 0;
    EXPECT_TRUE(named) << "data byte " << at << " (" << holder << ")";
    ++sampled;
  }
  write_file(path, bytes);
  EXPECT_GT(sampled, 100);
  EXPECT_TRUE(verify_output(dir).ok());
  fs::remove_all(dir);
}

// Every byte of the manifest, one bit each (bit = byte index mod 8, so every bit position is used):
// verify fails naming the manifest.
TEST(Verify, EveryByteOfTheManifestIsCovered) {
  const std::string dir = small_run_folder();
  const std::string path = dir + "/manifest.json";
  const std::string bytes = read_file(path);
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::string damaged = bytes;
    damaged[at] = static_cast<char>(damaged[at] ^ (1 << (at % 8)));
    write_file(path, damaged);
    ASSERT_TRUE(names(verify_output(dir), kManifestName)) << "manifest byte " << at;
  }
  write_file(path, bytes);
  EXPECT_TRUE(verify_output(dir).ok());
  // A manifest that records no header checksum (format actcap/1) cannot prove its headers.
  json m = json::parse(bytes);
  m["shards"][0].erase("header_xxh3");
  write_file(path, seal_manifest(m));
  bool said = false;
  for (const VerifyIssue& i : verify_output(dir).issues)
    said |= i.problem.find("no header_xxh3") != std::string::npos;
  EXPECT_TRUE(said);
  fs::remove_all(dir);
}

namespace {

std::string demo_corpus(const std::string& dir, int docs) {
  const std::string path = dir + "/in.txt";
  std::ofstream in(path);
  for (int i = 0; i < docs; ++i) in << "document " << i << " is short but not empty\n";
  return path;
}

ExtractOptions demo_extract(const std::string& dir, const std::string& out) {
  ExtractOptions o;
  o.input = demo_corpus(dir, 40);
  o.out = out;
  o.capture.patterns = {"transformer.h.1", "transformer.h.3.mlp"};
  o.batch_size = 4;
  o.shard_bytes = 4 << 10;
  return o;
}

// Runs `o` (with its faults); returns the RunError's message ("" when it did not throw).
std::string run_failing(Model& m, const ExtractOptions& o) {
  auto tok = tokenizer_for("demo");
  try {
    run_extract(m, tok.get(), o);
  } catch (const RunError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Every byte of an unfinished extract's journal, one bit each: verify names the journal, except
// when the flip hits the last line's newline. That line then reads as an append a kill interrupted
// (the journal's rule), which claims nothing: the shard it named is no longer claimed (resume
// writes it again), and nothing unverified is.
TEST(Verify, EveryByteOfTheJournalIsCovered) {
  auto m = Model::load("demo");
  const std::string dir = temp_dir();
  ExtractOptions o = demo_extract(dir, dir + "/out");
  o.faults.damage_file = 2;
  ASSERT_NE(run_failing(*m, o), "");  // stops after claiming shards 0, 1
  const std::string path = o.out + "/manifest.journal";
  const std::string bytes = read_file(path);
  const VerifyReport before = verify_output(o.out);
  ASSERT_EQ(before.claimed, 2);
  ASSERT_EQ(before.issues.size(), 1u);  // not complete, nothing else
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::string damaged = bytes;
    damaged[at] = static_cast<char>(damaged[at] ^ (1 << (at % 8)));
    write_file(path, damaged);
    const VerifyReport r = verify_output(o.out);
    if (at + 1 == bytes.size()) {
      EXPECT_EQ(r.claimed, 1);
      continue;
    }
    ASSERT_TRUE(names(r, kJournalName)) << "journal byte " << at;
  }
  write_file(path, bytes);
  fs::remove_all(dir);
}

// Damage to the assembled rows before the checksums are taken is caught by checking them against
// the verified snapshots; damage after (while queued for the writer) by the read-back against
// those checksums. Either way the shard is never claimed and --resume gives the clean run's files.
// Fails without its defence: with the comparison against the snapshot fingerprints in
// assemble_shard (src/export/extract.cpp) disabled, the assembled fault went unseen: the run
// completed and claimed shard-00001, written with checksums taken over the damaged rows.
TEST(Verify, ExtractChecksumsFollowFromVerifiedData) {
  auto m = Model::load("demo");
  const std::string dir = temp_dir();
  ExtractOptions o = demo_extract(dir, dir + "/ok");
  auto tok = tokenizer_for("demo");
  run_extract(*m, tok.get(), o);
  ASSERT_TRUE(verify_output(o.out).ok());
  struct Case {
    const char* var;
    std::optional<int64_t> ExportFaults::*fault;
    const char* expect;
  };
  for (const Case& c :
       {Case{"damage_assembled", &ExportFaults::damage_assembled,
             "differ from the verified snapshot"},
        Case{"damage_queued", &ExportFaults::damage_queued, "does not read back as written"}}) {
    ExtractOptions bad = o;
    bad.out = dir + "/" + c.var;
    bad.faults.*(c.fault) = 1;
    const std::string what = run_failing(*m, bad);
    EXPECT_NE(what.find("shard-00001.safetensors"), std::string::npos) << c.var << ": " << what;
    EXPECT_NE(what.find(c.expect), std::string::npos) << c.var << ": " << what;
    if (std::string(c.var) == "damage_assembled") {
      EXPECT_NE(what.find("'transformer.h.1'"), std::string::npos) << what;
    }
    const VerifyReport r = verify_output(bad.out);
    ASSERT_EQ(r.claimed, 1) << c.var;  // shard 0 only
    std::vector<std::string> claimed;
    verify_output(bad.out, OutputLayout{}, [&](const json& e) { claimed.push_back(e["file"]); });
    EXPECT_EQ(claimed, std::vector<std::string>{"shard-00000.safetensors"});
    EXPECT_FALSE(fs::exists(bad.out + "/shard-00001.safetensors")) << c.var;
    bad.resume = true;
    bad.faults = {};
    run_extract(*m, tok.get(), bad);
    for (const auto& e : fs::directory_iterator(o.out)) {
      if (e.path().filename() == "manifest.json") continue;
      EXPECT_EQ(read_file(e.path().string()),
                read_file(bad.out + "/" + e.path().filename().string()))
          << c.var << " " << e.path().filename();
    }
    EXPECT_TRUE(verify_output(bad.out).ok()) << c.var;
  }
  fs::remove_all(dir);
}

// The row tensors a shard must hold follow its manifest's format: __rows__.token since actcap/3
// (folders written as actcap/2 verify without it), __rows__.step in a generation's.
TEST(ShardSchemaRows, TokenSinceActcap3AndStepForGenerations) {
  nlohmann::json m = {{"format", "actcap/2"},
                      {"model", {{"fingerprint", "0123456789abcdef"}}},
                      {"points", {{"h", {{"dtype", "F32"}, {"shape", {4}}}}}}};
  auto names = [&] {
    std::string problem;
    const std::optional<actcap::ShardSchema> s = actcap::shard_schema(m, problem);
    EXPECT_TRUE(s) << problem;
    std::vector<std::string> out;
    for (const auto& [name, t] : s->tensors) out.push_back(name);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(), (V{"__rows__.pos", "__rows__.seq", "h"}));
  m["format"] = actcap::kFormatVersion;
  EXPECT_EQ(names(), (V{"__rows__.pos", "__rows__.seq", "__rows__.token", "h"}));
  m["generation"] = {{"sequences", 1}, {"steps", 2}};
  EXPECT_EQ(names(), (V{"__rows__.pos", "__rows__.seq", "__rows__.step", "__rows__.token", "h"}));
  // A point may not take a row tensor's name.
  m["points"]["__rows__.token"] = {{"dtype", "I64"}, {"shape", nlohmann::json::array()}};
  std::string problem;
  EXPECT_FALSE(actcap::shard_schema(m, problem));
}
