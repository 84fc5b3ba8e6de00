#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "actcap/checkpoint.h"
#include "actcap/error.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"

namespace actcap {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "actcap-ck-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good());
}

std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InputError, nothing thrown";
  return "";
}

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

Tensors sample_tensors() {
  return {
      {"model.embed.weight", at::arange(24, at::kFloat).view({4, 6})},
      {"model.layers.0.mlp.weight", at::arange(10, at::kInt)},
      {"model.layers.1.mlp.weight", at::ones({2, 2}, at::kBFloat16)},
      {"model.norm.weight", at::full({3}, 0.5, at::kHalf)},
  };
}

void write_config(const TempDir& dir) { write_text(dir.file("config.json"), "{}"); }

// Splits `tensors` over two shards (first half, second half) with an index naming them all.
void write_sharded(const TempDir& dir, const Tensors& tensors) {
  const size_t half = tensors.size() / 2;
  const Tensors a(tensors.begin(), tensors.begin() + half);
  const Tensors b(tensors.begin() + half, tensors.end());
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), a, {});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), b, {});
  std::string map;
  for (size_t i = 0; i < tensors.size(); ++i) {
    map += (i ? ", \"" : "\"") + tensors[i].first + "\": \"model-0000" + (i < half ? "1" : "2") +
           "-of-00002.safetensors\"";
  }
  write_text(dir.file("model.safetensors.index.json"),
             "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {" + map + "}}");
}

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  write_config(dir);
  const Tensors tensors = sample_tensors();
  write_safetensors(dir.file("model.safetensors"), tensors, {});
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.dir(), dir.path());
  EXPECT_EQ(ck.config_path(), dir.file("config.json"));
  EXPECT_THAT(ck.files(), ElementsAre(dir.file("model.safetensors")));
  EXPECT_THAT(ck.names(), ElementsAre("model.embed.weight", "model.layers.0.mlp.weight",
                                      "model.layers.1.mlp.weight", "model.norm.weight"));
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(ck.has(name));
    EXPECT_TRUE(at::equal(ck.tensor(name), t));
    EXPECT_EQ(ck.info(name).dtype, t.scalar_type());
  }
  EXPECT_FALSE(ck.has("lm_head.weight"));
  const std::string msg = input_error([&] { ck.tensor("lm_head.weight"); });
  EXPECT_THAT(msg, HasSubstr("lm_head.weight"));
  EXPECT_THAT(msg, HasSubstr(dir.path()));
  EXPECT_THAT(input_error([&] { ck.info("lm_head.weight"); }), HasSubstr("lm_head.weight"));
}

TEST(Checkpoint, ShardedIndex) {
  TempDir dir;
  write_config(dir);
  const Tensors tensors = sample_tensors();
  write_sharded(dir, tensors);
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_THAT(ck.files(), ElementsAre(dir.file("model-00001-of-00002.safetensors"),
                                      dir.file("model-00002-of-00002.safetensors")));
  EXPECT_EQ(ck.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(ck.tensor(name), t)) << name;
}

TEST(Checkpoint, ShardTensorsMissingFromIndexAreStillAvailable) {
  TempDir dir;
  write_config(dir);
  write_safetensors(dir.file("a.safetensors"), {{"x", at::ones({2})}, {"extra", at::zeros({1})}},
                    {});
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": {"x": "a.safetensors"}})");
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_THAT(ck.names(), ElementsAre("extra", "x"));
  EXPECT_TRUE(at::equal(ck.tensor("extra"), at::zeros({1})));
}

TEST(Checkpoint, IndexListsMissingTensor) {
  TempDir dir;
  write_config(dir);
  write_safetensors(dir.file("a.safetensors"), {{"x", at::ones({2})}}, {});
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x": "a.safetensors", "ghost.weight": "a.safetensors"}})");
  const std::string msg = input_error([&] { Checkpoint::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("ghost.weight"));
  EXPECT_THAT(msg, HasSubstr("a.safetensors"));
}

TEST(Checkpoint, IndexListsMissingShard) {
  TempDir dir;
  write_config(dir);
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x": "model-00001-of-00001.safetensors"}})");
  const std::string msg = input_error([&] { Checkpoint::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("model-00001-of-00001.safetensors"));
  EXPECT_THAT(msg, HasSubstr("does not exist"));
}

TEST(Checkpoint, IndexEscapingDirectoryRejected) {
  TempDir outer;
  const std::string dir = outer.file("ck");
  fs::create_directory(dir);
  write_text(dir + "/config.json", "{}");
  // The file exists, so only the name check can stop it.
  write_safetensors(outer.file("evil.safetensors"), {{"x", at::ones({1})}}, {});
  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"x": "../evil.safetensors"}})");
  std::string msg = input_error([&] { Checkpoint::open(dir); });
  EXPECT_THAT(msg, HasSubstr("../evil.safetensors"));
  EXPECT_THAT(msg, HasSubstr("'x'"));
  EXPECT_THAT(msg, HasSubstr(".."));

  write_text(dir + "/model.safetensors.index.json",
             "{\"weight_map\": {\"x\": \"" + outer.file("evil.safetensors") + "\"}}");
  msg = input_error([&] { Checkpoint::open(dir); });
  EXPECT_THAT(msg, HasSubstr("relative"));

  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"x": "sub/../../evil.safetensors"}})");
  EXPECT_THAT(input_error([&] { Checkpoint::open(dir); }), HasSubstr("leaves the checkpoint"));
}

TEST(Checkpoint, MalformedIndex) {
  TempDir dir;
  write_config(dir);
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": {"x": 3}})");
  std::string msg = input_error([&] { Checkpoint::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(msg, HasSubstr("'x'"));

  write_text(dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
  EXPECT_THAT(input_error([&] { Checkpoint::open(dir.path()); }), HasSubstr("weight_map"));

  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": )");
  EXPECT_THAT(input_error([&] { Checkpoint::open(dir.path()); }), HasSubstr("not valid JSON"));

  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x": "a.safetensors", "x": "b.safetensors"}})");
  EXPECT_THAT(input_error([&] { Checkpoint::open(dir.path()); }),
              HasSubstr("key 'x' appears more than once"));
}

TEST(Checkpoint, PickleOnlyDirectory) {
  TempDir dir;
  write_config(dir);
  write_text(dir.file("pytorch_model.bin"), "not really a pickle");
  const std::string msg = input_error([&] { Checkpoint::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr(dir.path()));
  EXPECT_THAT(msg, HasSubstr("pickle checkpoint (pytorch_model.bin)"));
  EXPECT_THAT(msg, HasSubstr("safetensors"));
  EXPECT_THAT(msg, HasSubstr("safe_serialization=True"));
}

TEST(Checkpoint, OtherPickleFileNamesAlsoDetected) {
  TempDir dir;
  write_config(dir);
  write_text(dir.file("weights.pth"), "x");
  EXPECT_THAT(input_error([&] { Checkpoint::open(dir.path()); }),
              HasSubstr("pickle checkpoint (weights.pth)"));
}

TEST(Checkpoint, NoWeightsAtAll) {
  TempDir dir;
  write_config(dir);
  const std::string msg = input_error([&] { Checkpoint::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("no model.safetensors or model.safetensors.index.json in"));
  EXPECT_THAT(msg, HasSubstr(dir.path()));
}

TEST(Checkpoint, MissingConfig) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), sample_tensors(), {});
  const std::string msg = input_error([&] { Checkpoint::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("no config.json in " + dir.path()));
}

TEST(Checkpoint, MissingDirectory) {
  TempDir dir;
  const std::string msg = input_error([&] { Checkpoint::open(dir.file("nope")); });
  EXPECT_THAT(msg, HasSubstr(dir.file("nope")));
  EXPECT_THAT(msg, HasSubstr("does not exist"));
}

TEST(Checkpoint, SameTensorInTwoShards) {
  TempDir dir;
  write_config(dir);
  write_safetensors(dir.file("a.safetensors"), {{"x", at::ones({2})}}, {});
  write_safetensors(dir.file("b.safetensors"), {{"x", at::zeros({2})}, {"y", at::ones({1})}}, {});
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  const std::string msg = input_error([&] { Checkpoint::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("tensor 'x' appears in both"));
  EXPECT_THAT(msg, HasSubstr("a.safetensors"));
  EXPECT_THAT(msg, HasSubstr("b.safetensors"));
}

TEST(Checkpoint, MalformedShardNamesFile) {
  TempDir dir;
  write_config(dir);
  write_text(dir.file("model.safetensors"), "garbage");
  const std::string msg = input_error([&] { Checkpoint::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr(dir.file("model.safetensors")));
}

TEST(Checkpoint, FingerprintIgnoresShardingButSeesEveryByte) {
  TempDir one;
  write_config(one);
  write_safetensors(one.file("model.safetensors"), sample_tensors(), {});
  TempDir two;
  write_config(two);
  write_sharded(two, sample_tensors());

  const std::string fp1 = Checkpoint::open(one.path()).fingerprint();
  const std::string fp2 = Checkpoint::open(two.path()).fingerprint();
  EXPECT_EQ(fp1.size(), 16u);
  EXPECT_EQ(fp1, fp2);
  EXPECT_EQ(Checkpoint::open(one.path()).fingerprint(), fp1);

  // Flip the last data byte of the single file.
  {
    std::fstream f(one.file("model.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 1));
    ASSERT_TRUE(f.good());
  }
  EXPECT_NE(Checkpoint::open(one.path()).fingerprint(), fp1);
}

TEST(Checkpoint, FingerprintSeesShapeAndDtype) {
  TempDir a;
  write_config(a);
  write_safetensors(a.file("model.safetensors"), {{"x", at::zeros({2, 3})}}, {});
  TempDir b;
  write_config(b);
  write_safetensors(b.file("model.safetensors"), {{"x", at::zeros({3, 2})}}, {});
  TempDir c;
  write_config(c);
  write_safetensors(c.file("model.safetensors"), {{"x", at::zeros({6}, at::kInt)}}, {});
  const std::string fa = Checkpoint::open(a.path()).fingerprint();
  EXPECT_NE(fa, Checkpoint::open(b.path()).fingerprint());
  EXPECT_NE(fa, Checkpoint::open(c.path()).fingerprint());
}

TEST(Hash, Hex64IsSixteenLowercaseDigits) {
  EXPECT_EQ(hex64(0), "0000000000000000");
  EXPECT_EQ(hex64(0xABCDEF), "0000000000abcdef");
  EXPECT_EQ(hex64(~uint64_t{0}), "ffffffffffffffff");
}

TEST(Hash, TensorHashUsesLogicalBytes) {
  const at::Tensor t = at::arange(12, at::kFloat).view({3, 4});
  const at::Tensor tt = t.t();
  const at::Tensor copy = tt.contiguous();
  EXPECT_EQ(tensor_xxh3(tt), tensor_xxh3(copy));
  EXPECT_EQ(tensor_xxh3(copy), xxh3(copy.data_ptr(), 12 * sizeof(float)));
  EXPECT_NE(tensor_xxh3(t), tensor_xxh3(tt));
  EXPECT_EQ(tensor_xxh3(at::empty({0, 4})), xxh3(nullptr, 0));
  EXPECT_EQ(xxh3("", 0), xxh3(nullptr, 0));
}

}  // namespace
}  // namespace actcap
