// A manifest written as a stream (write_manifest_streamed: the shard list walked twice from its
// sources, never held) is byte for byte the one write_manifest writes for the same manifest held
// whole; read back as a stream it is sealed and gives the same entries; a list that is not the
// one expected, or changes between the two walks, writes nothing.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "export/layout.h"
#include "export/manifest.h"

using namespace actcap;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/actcap-manifest-XXXXXX";
  return mkdtemp(tmpl);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

json entry(int i) {
  return {{"file", OutputLayout{}.shard(i)},
          {"rows", 10 + i},
          {"bytes", 1000 * i},
          {"first_line", 2 * i},
          {"last_line", 2 * i + 1},
          {"checksums", {{"a.b", "00ff"}, {"__rows__.seq", "1234"}}},
          {"nested", {json::array(), json::object(), {1, {2, 3}}, "line\nbreak \"q\" \u00e9"}}};
}

EntrySource from(const json& list) {
  return [list](const EntryVisitor& each) {
    for (const json& e : list) each(e);
  };
}

json outline() {
  return {{"format", "actcap/3"},
          {"complete", true},
          {"model", {{"path", "/m \u00fc"}, {"fingerprint", "ab"}}},
          {"points", {{"h.0", {{"dtype", "F32"}, {"shape", {4}}}}}},
          {"rows", 7},
          {"shards", json::array()},
          {"zzz", {{"after", "the list"}}}};
}

}  // namespace

TEST(Manifest, StreamedIsByteIdenticalToWhole) {
  const std::string dir = temp_dir();
  for (int n : {0, 1, 2, 7}) {
    json list = json::array();
    for (int i = 0; i < n; ++i) list.push_back(entry(i));
    json whole = outline();
    whole["shards"] = list;
    write_manifest(dir, whole, nullptr, "whole.json");
    const std::string sealed =
        write_manifest_streamed(dir, outline(), from(list), nullptr, nullptr, "streamed.json");
    const std::string text = read_file(dir + "/streamed.json");
    EXPECT_EQ(text, read_file(dir + "/whole.json")) << n << " entries";
    EXPECT_EQ(json::parse(text)["manifest_checksum"], sealed);
    EXPECT_TRUE(manifest_sealed(json::parse(text)));

    // Read back as a stream: the outline without the list, then every entry, sealed.
    std::string problem;
    const std::optional<json> o = manifest_outline(dir + "/streamed.json", problem);
    ASSERT_TRUE(o) << problem;
    EXPECT_EQ((*o)["shards"], json::array());
    json again = json::array();
    EXPECT_TRUE(stream_manifest_entries(dir + "/streamed.json", *o,
                                        [&](const json& e) { again.push_back(e); }));
    EXPECT_EQ(again, list);
  }
  fs::remove_all(dir);
}

TEST(Manifest, AKeyLikeTheListPlaceholderChangesNothing) {
  const std::string dir = temp_dir();
  json o = outline();
  o["\x01"
    "actcap shard list"
    "\x01"] =
      "\x01"
      "actcap shard list"
      "\x01";  // sorts before "shards"
  json whole = o;
  whole["shards"] = json::array({entry(0), entry(1)});
  write_manifest(dir, whole, nullptr, "whole.json");
  write_manifest_streamed(dir, o, from(whole["shards"]), nullptr, nullptr, "streamed.json");
  EXPECT_EQ(read_file(dir + "/streamed.json"), read_file(dir + "/whole.json"));
  std::string problem;
  const std::optional<json> back = manifest_outline(dir + "/streamed.json", problem);
  ASSERT_TRUE(back);
  EXPECT_TRUE(stream_manifest_entries(dir + "/streamed.json", *back, [](const json&) {}));
  fs::remove_all(dir);
}

TEST(Manifest, AnEditedEntryBreaksTheStreamedSeal) {
  const std::string dir = temp_dir();
  const json list = json::array({entry(0), entry(1), entry(2)});
  write_manifest_streamed(dir, outline(), from(list), nullptr, nullptr, "m.json");
  std::string text = read_file(dir + "/m.json");
  const size_t at = text.find("\"rows\": 11");
  ASSERT_NE(at, std::string::npos);
  text[at + 9] = '2';
  std::ofstream(dir + "/m.json", std::ios::binary | std::ios::trunc) << text;
  std::string problem;
  const std::optional<json> o = manifest_outline(dir + "/m.json", problem);
  ASSERT_TRUE(o);
  EXPECT_FALSE(stream_manifest_entries(dir + "/m.json", *o, [](const json&) {}));
  EXPECT_THROW(manifest_entries(dir + "/m.json", *o)([](const json&) {}), RunError);
  fs::remove_all(dir);
}

// A running rank replaces its manifest (by rename) while another process reads it: the file held
// open gives the version its outline came from, whole and sealed; reopening the path for the
// second pass finds the next version and must not pass it off as the first.
TEST(Manifest, AManifestReplacedBetweenThePassesIsReadAsTheVersionHeldOpen) {
  const std::string dir = temp_dir();
  const json before = json::array({entry(0), entry(1)});
  json running = outline();
  running["complete"] = false;
  write_manifest_streamed(dir, running, from(before), nullptr, nullptr, "m.json");
  ManifestFile held(dir + "/m.json");
  std::string problem;
  const std::optional<json> o = held.outline(problem);
  ASSERT_TRUE(o) << problem;

  const json after = json::array({entry(0), entry(1), entry(2)});
  json next = running;
  next["rows"] = 8;
  write_manifest_streamed(dir, next, from(after), nullptr, nullptr, "m.json");  // renamed over

  json seen = json::array();
  EXPECT_TRUE(held.entries(*o, [&](const json& e) { seen.push_back(e); }));
  EXPECT_EQ(seen, before);
  EXPECT_THROW(stream_manifest_entries(dir + "/m.json", *o, [](const json&) {}), json::exception);
  // The held version is a source that can be walked again (merge walks it twice), and the file
  // knows that its path names another file now (merge: that rank is running again).
  auto shared = std::make_shared<ManifestFile>(dir + "/m.json");
  const std::optional<json> first = shared->outline(problem);
  ASSERT_TRUE(first) << problem;
  const EntrySource source = manifest_entries(shared, *first);
  EXPECT_TRUE(held.replaced());
  EXPECT_FALSE(shared->replaced());
  write_manifest_streamed(dir, running, from(before), nullptr, nullptr, "m.json");  // renamed over
  EXPECT_TRUE(shared->replaced());
  for (int walk = 0; walk < 2; ++walk) {
    json again = json::array();
    source([&](const json& e) { again.push_back(e); });
    EXPECT_EQ(again, after) << "walk " << walk;
  }
  fs::remove(dir + "/m.json");
  EXPECT_TRUE(shared->replaced());                         // removed
  EXPECT_FALSE(ManifestFile(dir + "/m.json").replaced());  // nothing held: cannot tell
  fs::remove_all(dir);
}

TEST(Manifest, AListOtherThanTheExpectedWritesNothing) {
  const std::string dir = temp_dir();
  const json list = json::array({entry(0), entry(1)});
  write_manifest_streamed(dir, outline(), from(list), nullptr, nullptr, "m.json");
  const std::string before = read_file(dir + "/m.json");

  EntryTally expected;
  for (const json& e : list) expected.add(e);
  json other = list;
  other[1]["rows"] = 99;
  EXPECT_THROW(write_manifest_streamed(dir, outline(), from(other), &expected, nullptr, "m.json"),
               RunError);
  EXPECT_THROW(write_manifest_streamed(dir, outline(), from(json::array({entry(0)})), &expected,
                                       nullptr, "m.json"),
               RunError);

  // A source that gives another list on its second walk.
  int walks = 0;
  const EntrySource changing = [&](const EntryVisitor& each) {
    each(entry(0));
    if (walks++ == 0) each(entry(1));
  };
  EXPECT_THROW(write_manifest_streamed(dir, outline(), changing, nullptr, nullptr, "m.json"),
               RunError);
  EXPECT_EQ(read_file(dir + "/m.json"), before);
  for (const auto& f : fs::directory_iterator(dir))  // no temp file left behind
    EXPECT_EQ(f.path().filename(), "m.json");
  write_manifest_streamed(dir, outline(), from(list), &expected, nullptr, "m.json");
  EXPECT_EQ(read_file(dir + "/m.json"), before);
  fs::remove_all(dir);
}

TEST(Manifest, TallyIsOrderSensitive) {
  EntryTally ab, ba, a;
  ab.add(entry(0));
  ab.add(entry(1));
  ba.add(entry(1));
  ba.add(entry(0));
  a.add(entry(0));
  EXPECT_FALSE(ab == ba);
  EXPECT_FALSE(ab == a);
  EXPECT_EQ(ab.count(), 2);
  EntryTally again;
  again.add(entry(0));
  again.add(entry(1));
  EXPECT_TRUE(ab == again);
}

TEST(Manifest, ShardIndexReadsOnlyTheNamesShardGives) {
  const OutputLayout single, rank{3, 8};
  EXPECT_EQ(single.shard_index("shard-00042.safetensors"), 42);
  EXPECT_EQ(single.shard_index(single.shard(123456)), 123456);
  EXPECT_EQ(rank.shard_index("shard-r00003-00007.safetensors"), 7);
  EXPECT_FALSE(rank.shard_index("shard-r00004-00007.safetensors"));
  EXPECT_FALSE(single.shard_index("shard-r00003-00007.safetensors"));
  EXPECT_FALSE(rank.shard_index("shard-00007.safetensors"));
  for (const char* bad :
       {"shard-0042.safetensors", "shard-000042.safetensors", "shard-00042.safetensors.tmp.12",
        "shard-0004x.safetensors", "shard-.safetensors", "manifest.json"})
    EXPECT_FALSE(single.shard_index(bad)) << bad;
}
