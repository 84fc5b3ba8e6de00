// Library-level faults: exceptions thrown from user hooks on a split model, and the extract writer
// thread failing mid-run (run in-process, so the sanitizer builds see both threads).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/extract.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/planner.h"
#include "export/journal.h"
#include "models/weights.h"

using namespace actcap;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<Model> split_llama(int devices) {
  ModelConfig c = preset_config("llama", "tiny");
  auto m = Model::from_tensors(c, random_weights(c, 5, at::kFloat), "llama");
  PlanRequest req;
  req.stages = m->stage_costs(2, 8);
  for (int i = 0; i < devices; ++i) req.devices.push_back(DeviceId::virtual_cpu(i));
  req.strategy = PlanStrategy::kBalanced;
  req.hidden_bytes = 2 * 8 * c.hidden_size * 4;
  ExecutionOptions opts;
  opts.stage_device = plan_devices(req).stage_device;
  m->place(opts);
  return m;
}

Batch batch_for(const Model& m) {
  return Batch::from_sequences({{5, 9, 2, 7, 11, 3, 8, 1}, {7, 3, 4}}, m.config().vocab_size,
                               m.config().max_positions());
}

std::string temp_dir() {
  char tmpl[] = "/tmp/actcap-faults-XXXXXX";
  return mkdtemp(tmpl);
}

struct ThrowCase {
  const char* point;
  std::function<void()> raise;
  const char* expect;  // in the message
};

}  // namespace

TEST(Faults, ExceptionFromAUserHookNamesThePointAndTheSplitModelStaysUsable) {
  auto m = split_llama(3);
  const Batch b = batch_for(*m);
  const at::Tensor before = m->forward(b);
  const std::vector<ThrowCase> cases = {
      {"model.layers.0.mlp", [] { throw std::runtime_error("boom"); }, "boom"},
      {"model.layers.1.self_attn:input", [] { throw std::out_of_range("index 9"); }, "index 9"},
      {"model.norm", [] { TORCH_CHECK(false, "a libtorch check failed"); },
       "a libtorch check failed"},
      {"lm_head", [] { throw 42; }, "not a std::exception"},
  };
  for (const ThrowCase& c : cases) {
    SCOPED_TRACE(c.point);
    auto h = m->register_forward_hook(c.point,
                                      [&](const HookContext&, const at::Tensor&) { c.raise(); });
    try {
      m->forward(b);
      FAIL() << "expected RunError";
    } catch (const RunError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("'") + c.point + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
      EXPECT_EQ(msg.find("Exception raised from"), std::string::npos)
          << "no LibTorch backtrace: " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    }
    h.remove();
    EXPECT_TRUE(at::equal(before, m->forward(b)))
        << "the model must be usable, bit-identical, after a failed forward";
  }
}

TEST(Faults, ExtractWriterThreadDrainsAndFailsCleanly) {
  auto m = Model::load("demo");
  const std::string dir = temp_dir();
  {
    std::ofstream in(dir + "/in.txt");
    for (int i = 0; i < 120; ++i)
      in << "document number " << i << " says hello to the writer thread\n";
  }
  ExtractOptions o;
  o.input = dir + "/in.txt";
  o.capture.patterns = {"transformer.h.*"};
  o.batch_size = 4;
  o.shard_bytes = 8 << 10;
  o.queue_shards = 1;  // the compute thread blocks on the writer: the back-pressure path
  auto tok = tokenizer_for("demo");

  o.out = dir + "/ok";
  ExtractResult r = run_extract(*m, tok.get(), o);
  EXPECT_GE(r.progress.shards_written, 4);
  EXPECT_TRUE(verify_output(o.out).ok());

  // The writer fails on shard 2 (damaged before read-back): the error crosses to the caller,
  // shards 0 and 1 stay claimed, nothing else is.
  o.out = dir + "/bad";
  o.faults.damage_file = 2;
  try {
    run_extract(*m, tok.get(), o);
    FAIL() << "expected RunError";
  } catch (const RunError& e) {
    o.faults = {};
    EXPECT_NE(std::string(e.what()).find("shard-00002.safetensors"), std::string::npos) << e.what();
  }
  std::ifstream mf(o.out + "/manifest.json");
  auto manifest = nlohmann::json::parse(mf);
  EXPECT_FALSE(manifest["complete"].get<bool>());
  EXPECT_TRUE(manifest["shards"].empty());  // an unfinished run claims its shards in the journal
  EXPECT_TRUE(merge_journal(o.out, manifest["shards"]).empty());
  ASSERT_EQ(manifest["shards"].size(), 2u);
  EXPECT_EQ(manifest["shards"][1]["file"], "shard-00001.safetensors");
  EXPECT_FALSE(fs::exists(o.out + "/shard-00002.safetensors"));

  // Resume without the fault: the same files as the clean run.
  o.resume = true;
  run_extract(*m, tok.get(), o);
  EXPECT_FALSE(fs::exists(o.out + "/manifest.journal"));  // taken into the manifest, then removed
  for (const auto& e : fs::directory_iterator(dir + "/ok")) {
    std::ifstream a(e.path(), std::ios::binary),
        b(o.out + "/" + e.path().filename().string(), std::ios::binary);
    const std::string sa((std::istreambuf_iterator<char>(a)), {}),
        sb((std::istreambuf_iterator<char>(b)), {});
    if (e.path().filename() != "manifest.json") {
      EXPECT_TRUE(sa == sb) << e.path();
    }
  }
  EXPECT_TRUE(verify_output(o.out).ok());
  fs::remove_all(dir);
}

// --resume streams the claimed list rather than holding it, so it requires the list extract writes:
// shards 0, 1, 2, ... in order. A sealed, verified list naming another file is refused, named.
TEST(Faults, ResumeRefusesAClaimedListNotInShardOrder) {
  auto m = Model::load("demo");
  const std::string dir = temp_dir();
  {
    std::ofstream in(dir + "/in.txt");
    for (int i = 0; i < 60; ++i) in << "document " << i << " for the shard order\n";
  }
  ExtractOptions o;
  o.input = dir + "/in.txt";
  o.capture.patterns = {"transformer.h.1"};
  o.shard_bytes = 4 << 10;
  o.out = dir + "/run";
  o.faults.damage_file = 2;  // stops with shards 0 and 1 claimed in the journal
  auto tok = tokenizer_for("demo");
  EXPECT_THROW(run_extract(*m, tok.get(), o), RunError);
  o.faults = {};
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(o.out + "/manifest.json"));
  ASSERT_TRUE(merge_journal(o.out, manifest["shards"]).empty());
  ASSERT_EQ(manifest["shards"].size(), 2u);
  // Shard 1 under another valid name, its entry saying so: every file still verifies.
  fs::rename(o.out + "/shard-00001.safetensors", o.out + "/shard-00005.safetensors");
  manifest["shards"][1]["file"] = "shard-00005.safetensors";
  manifest.erase("manifest_checksum");
  std::ofstream(o.out + "/manifest.json", std::ios::trunc) << seal_manifest(manifest);
  fs::remove(o.out + "/manifest.journal");
  const VerifyReport before = verify_output(o.out);
  for (const VerifyIssue& i : before.issues)
    EXPECT_EQ(i.kind, VerifyIssue::Kind::kIncomplete) << i.file << ": " << i.problem;
  o.resume = true;
  try {
    run_extract(*m, tok.get(), o);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("shard-00005.safetensors, not shard-00001.safetensors"), std::string::npos)
        << msg;
  }
  EXPECT_TRUE(fs::exists(o.out + "/shard-00005.safetensors"));  // nothing removed
  fs::remove_all(dir);
}

// A process killed with SIGKILL in the middle of a write leaves `<file>.tmp.<pid>` behind: those
// are actcap's to remove (--resume, --overwrite); files that merely look alike are the user's.
TEST(Faults, TempFilesOfAKilledWriteAreOursToRemoveAndNothingElseIs) {
  EXPECT_TRUE(is_output_file("manifest.json"));
  EXPECT_TRUE(is_output_file("manifest.json.tmp.31813"));
  EXPECT_TRUE(is_output_file("shard-00002.safetensors"));
  EXPECT_TRUE(is_output_file("shard-00002.safetensors.tmp.31813"));
  EXPECT_FALSE(is_output_file("notes.tmp.txt"));
  EXPECT_FALSE(is_output_file("manifest.json.bak"));
  EXPECT_FALSE(is_output_file("shard-notes.txt"));
  EXPECT_FALSE(is_output_file("shard-00002.safetensors.bak"));
  EXPECT_FALSE(is_output_file("manifest.json.tmp."));
  EXPECT_FALSE(is_output_file("manifest.json.tmp.12a"));
  EXPECT_TRUE(is_output_file("manifest.journal"));

  const std::string dir = temp_dir();
  for (const char* n :
       {"manifest.json", "manifest.json.tmp.1", "shard-00000.safetensors.tmp.1", "notes.tmp.txt"})
    std::ofstream(dir + "/" + n) << "x";
  prepare_output_dir(dir, /*overwrite=*/true);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"notes.tmp.txt"});
  fs::remove_all(dir);
}

// The journal claims shards one appended line each: a torn last line (a kill mid-append) is not
// claimed and not an error; a damaged whole line is an error and nothing after it is trusted;
// entries already in the manifest (a resume killed after consolidating) are not claimed twice.
TEST(Faults, JournalClaimsWholeLinesOnly) {
  const std::string dir = temp_dir();
  const nlohmann::json a = {{"file", "shard-00000.safetensors"}, {"rows", 3}},
                       b = {{"file", "shard-00001.safetensors"}, {"rows", 4}};
  nlohmann::json shards = nlohmann::json::array();
  EXPECT_TRUE(merge_journal(dir, shards).empty());  // no journal: nothing claimed, no problem
  EXPECT_TRUE(shards.empty());
  {
    JournalWriter j(dir);
    j.append(a);
    j.append(b);
  }
  const std::string path = dir + "/manifest.journal";
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_TRUE(merge_journal(dir, shards).empty());
  EXPECT_EQ(shards, nlohmann::json::array({a, b}));

  shards = nlohmann::json::array({a});  // already consolidated: not claimed twice
  EXPECT_TRUE(merge_journal(dir, shards).empty());
  EXPECT_EQ(shards, nlohmann::json::array({a, b}));

  std::ofstream(path, std::ios::trunc) << text << R"({"shard": {"file": "shard-00002.saf)";  // torn
  shards = nlohmann::json::array();
  EXPECT_TRUE(merge_journal(dir, shards).empty());
  EXPECT_EQ(shards.size(), 2u);

  std::string damaged = text;
  damaged[damaged.find("\"rows\":3") + 7] = '9';  // line 1 now says 9 rows
  std::ofstream(path, std::ios::trunc) << damaged;
  shards = nlohmann::json::array();
  const auto problems = merge_journal(dir, shards);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("line 1 is damaged"), std::string::npos) << problems[0];
  EXPECT_TRUE(shards.empty());

  JournalWriter(dir).remove();
  EXPECT_FALSE(fs::exists(path));
  fs::remove_all(dir);
}
