// Assembling a ranked extract while a rank starts again over the folder (docs/scale.md, "Another
// world size"): no manifest.json that lists the files being replaced survives, and the assembler
// removes only the manifest.json it wrote, never one written over it by the next run.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/extract.h"
#include "actcap/model.h"
#include "actcap/tokenizer.h"
#include "export/layout.h"
#include "export/manifest.h"
#include "export/merge.h"
#include "io/atomic_file.h"

using namespace actcap;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/actcap-merge-XXXXXX";
  return mkdtemp(tmpl);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Rank `rank` of a run of two over DIR/in.txt into DIR/out, leaving the assembly to the test.
ExtractOptions rank_options(const std::string& dir, int rank) {
  ExtractOptions o;
  o.input = dir + "/in.txt";
  o.out = dir + "/out";
  o.capture.patterns = {"transformer.h.1"};
  o.batch_size = 4;
  o.shard_bytes = 4 << 10;
  o.rank = rank;
  o.world_size = 2;
  o.assemble = false;
  return o;
}

// Both ranks of that run over a small corpus, each complete, nothing assembled.
std::string two_complete_ranks(const std::string& dir) {
  {
    std::ofstream in(dir + "/in.txt");
    for (int i = 0; i < 12; ++i) in << "document " << i << " is short but not empty\n";
  }
  auto m = Model::load("demo");
  auto tok = tokenizer_for("demo");
  for (int r = 0; r < 2; ++r) run_extract(*m, tok.get(), rank_options(dir, r));
  return dir + "/out";
}

// What a rank starting again (--overwrite) does first: its manifest replaced by the new run's
// head, not yet complete.
void start_again(const std::string& out, int rank) {
  const std::string file = OutputLayout{rank, 2}.manifest();
  std::string problem;
  std::optional<json> head = manifest_outline(out + "/" + file, problem);
  ASSERT_TRUE(head) << problem;
  (*head)["complete"] = false;
  (*head)["shards"] = json::array();
  (*head)["rows"] = 0;
  write_manifest(out, *head, nullptr, file);
}

}  // namespace

TEST(Merge, TwoCompleteRanksAreAssembled) {
  const std::string dir = temp_dir();
  const std::string out = two_complete_ranks(dir);
  const MergeReport r = merge_ranks(out);
  EXPECT_TRUE(r.assembled);
  EXPECT_TRUE(r.waiting.empty());
  EXPECT_TRUE(verify_output(out).ok());
  fs::remove_all(dir);
}

// The rank replaced its manifest after the assembly read it and before the assembler looked
// again: the manifest.json just written lists that rank's old shards, which it removes next. It
// goes, and the rank is named as running again.
TEST(Merge, ARankThatStartedAgainWhileTheAssemblyWasWrittenHasItRemoved) {
  const std::string dir = temp_dir();
  const std::string out = two_complete_ranks(dir);
  bool seen = false;
  const MergeReport r = merge_ranks_observed(out, {}, 0, [&] {
    seen = fs::exists(out + "/" + kManifestName);  // written
    start_again(out, 1);
  });
  EXPECT_TRUE(seen);
  EXPECT_FALSE(r.assembled);
  ASSERT_EQ(r.waiting.size(), 1u);
  EXPECT_NE(r.waiting[0].find("rank 1 of 2 is running again"), std::string::npos) << r.waiting[0];
  EXPECT_FALSE(fs::exists(out + "/" + kManifestName));
  EXPECT_FALSE(verify_output(out).ok());  // nothing looks complete
  fs::remove_all(dir);
}

// The same, and the next run's own manifest.json was written over the assembler's before it
// looked again: the assembler removes its own file only, so the newer one stays, byte for byte.
// Fails with a check-then-remove (the path's file compared with the one written, then unlinked):
// the file compared is the newer one by then.
TEST(Merge, AManifestWrittenOverTheAssemblersIsKept) {
  const std::string dir = temp_dir();
  const std::string out = two_complete_ranks(dir);
  const std::string path = out + "/" + kManifestName;
  std::string newer;
  const MergeReport r = merge_ranks_observed(out, {}, 0, [&] {
    start_again(out, 1);
    newer = read_file(path);
    ASSERT_FALSE(newer.empty());
    newer.insert(newer.size() - 1, " ");  // another file, other bytes, renamed over it
    write_file_atomic(path, newer);
  });
  EXPECT_FALSE(r.assembled);
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(read_file(path), newer);
  for (const auto& e : fs::directory_iterator(out))  // nothing left aside
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  fs::remove_all(dir);
}

// The rank starts again after the assembler looked: it removes manifest.json itself, after its
// manifest was replaced (start_run's order), so the dataset never looks complete over files it
// removes. Here with the real run: rank 1 of the run again with --overwrite.
TEST(Merge, ARankStartingAgainAfterTheAssemblyRemovesIt) {
  const std::string dir = temp_dir();
  const std::string out = two_complete_ranks(dir);
  ASSERT_TRUE(merge_ranks(out).assembled);
  const std::string path = out + "/" + kManifestName;
  ASSERT_TRUE(fs::exists(path));
  auto m = Model::load("demo");
  auto tok = tokenizer_for("demo");
  ExtractOptions o = rank_options(dir, 1);
  o.overwrite = true;
  // Its start (head written, manifest.json and its old files removed) comes before its first
  // shard is claimed: stop it there.
  o.faults.damage_file = 0;
  EXPECT_THROW(run_extract(*m, tok.get(), o), RunError);
  EXPECT_FALSE(fs::exists(path));
  // Finished, the rank's files make the same dataset as before.
  o.faults = {};
  o.overwrite = false;
  o.resume = true;
  run_extract(*m, tok.get(), o);
  ASSERT_TRUE(merge_ranks(out).assembled);
  EXPECT_TRUE(verify_output(out).ok());
  fs::remove_all(dir);
}

TEST(AtomicFile, RemoveIfSameRemovesOnlyTheFileItNames) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/f";
  const HeldFile a = write_file_atomic(path, std::string("a"));
  EXPECT_EQ(file_id(path), a.id());
  const HeldFile b = write_file_atomic(path, std::string("b"));  // renamed over a
  EXPECT_NE(a.id(), b.id());
  EXPECT_FALSE(remove_if_same(path, a));  // a is gone; b stays
  EXPECT_EQ(read_file(path), "b");
  EXPECT_EQ(file_id(path), b.id());
  EXPECT_TRUE(remove_if_same(path, b));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(remove_if_same(path, b));  // nothing there
  EXPECT_TRUE(fs::is_empty(dir));         // nothing left aside
  fs::remove_all(dir);
}

TEST(AtomicFile, RemoveIfSameRemovesTheFileWhenALeftoverTempLinksIt) {
  // A leftover under the first aside name, linked to the file itself (an earlier remove_if_same
  // killed between its link() and its unlink()): rename() onto it would do nothing and leave the
  // file under its name. The aside name taken names nothing.
  const std::string dir = temp_dir();
  const std::string path = dir + "/f";
  const HeldFile a = write_file_atomic(path, std::string("a"));
  ASSERT_EQ(::link(path.c_str(), temp_name_for(path, 0).c_str()), 0);
  EXPECT_TRUE(remove_if_same(path, a));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(read_file(temp_name_for(path, 0)), "a");  // the leftover stays, unchanged
  EXPECT_FALSE(fs::exists(temp_name_for(path, 1)));   // nothing else left aside
  // Another writer's file under the name: put back, the leftover left alone.
  write_file_atomic(path, std::string("b"));
  EXPECT_FALSE(remove_if_same(path, a));
  EXPECT_EQ(read_file(path), "b");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
  fs::remove_all(dir);
}

TEST(AtomicFile, RemoveIfSameKeepsANewerFileOnAFreedInode) {
  // A removed file's inode number is free for the next file (ext4 reuses it at once): the file
  // written is held open, so its number cannot pass to a newer file under the same name.
  const std::string dir = temp_dir();
  const std::string path = dir + "/f";
  const HeldFile a = write_file_atomic(path, std::string("a"));
  fs::remove(path);                           // by another process
  write_file_atomic(path, std::string("b"));  // a newer file, not held
  EXPECT_FALSE(remove_if_same(path, a));
  EXPECT_EQ(read_file(path), "b");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);  // none aside
  fs::remove_all(dir);
}
