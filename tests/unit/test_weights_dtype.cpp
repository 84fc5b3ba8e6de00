// 16-bit checkpoints stay 16-bit (WeightsDtype::kKeep): the same outputs as widening at load, half
// the weight memory, one reused scratch per device, aligned float32 matrices, and init-model's
// streamed writer producing the bytes the in-memory one did.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "actcap/error.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/planner.h"
#include "actcap/safetensors.h"
#include "models/arch/architecture.h"
#include "models/arch/llama_family.h"
#include "models/weights.h"
#include "tiny_models.h"

using namespace actcap;
using test::every_architecture;

namespace {

std::unique_ptr<Model> tiny(const std::string& arch, at::ScalarType stored, WeightsDtype mode) {
  LoadOptions o;
  o.weights_dtype = mode;
  return test::tiny_model(arch, stored, o);
}

Batch batch_of(const Model& m) {
  return Batch::from_sequences({{1, 5, 9, 2, 7, 3, 11, 4}, {8, 6, 10}}, m.config().vocab_size,
                               m.config().max_positions());
}

uint64_t total_weight_bytes(const Model& m) {
  uint64_t n = 0;
  for (const DeviceStats& s : m.device_stats()) n += s.weight_bytes;
  return n;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class SixteenBitEveryArch : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(SixteenBitEveryArch, KeepGivesTheOutputsOfWideningAtLoadBitForBit) {
  for (at::ScalarType stored : {at::kBFloat16, at::kHalf}) {
    auto keep = tiny(GetParam(), stored, WeightsDtype::kKeep);
    auto wide = tiny(GetParam(), stored, WeightsDtype::kF32);
    const Batch b = batch_of(*keep);
    const at::Tensor a = keep->forward(b), w = wide->forward(b);
    EXPECT_EQ(a.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(a, w)) << stored << ": max |diff| " << (a - w).abs().max().item<float>();
    // Half the matrix bytes; the vectors (norms, biases) are float32 either way.
    const uint64_t kept = total_weight_bytes(*keep), widened = total_weight_bytes(*wide);
    EXPECT_LT(kept, widened * 55 / 100) << kept << " vs " << widened;
    EXPECT_GT(kept, widened * 45 / 100) << kept << " vs " << widened;
  }
}

TEST_P(SixteenBitEveryArch, KeepSplitOverThreeDevicesEqualsOneDevice) {
  auto m = tiny(GetParam(), at::kBFloat16, WeightsDtype::kKeep);
  const Batch b = batch_of(*m);
  const at::Tensor one = m->forward(b);
  test::place_balanced(*m, b, 3);
  const at::Tensor three = m->forward(b);
  EXPECT_TRUE(at::equal(one, three));
}

INSTANTIATE_TEST_SUITE_P(Archs, SixteenBitEveryArch, ::testing::ValuesIn(every_architecture()));

TEST(WeightsDtype, SixteenBitMatricesStayMappedVectorsAreWidened) {
  std::map<std::string, at::Tensor> t;
  t["m"] = at::randn({8, 4}).to(at::kBFloat16);
  t["v"] = at::randn({8}).to(at::kBFloat16);
  WeightSource keep = WeightSource::load(t, "ckpt", /*keep_16bit=*/true);
  const at::Tensor m = keep.get("m", {8, 4}), v = keep.get("v", {8}, Init::kGain);
  EXPECT_EQ(m.scalar_type(), at::kBFloat16);
  EXPECT_EQ(m.data_ptr(), t["m"].data_ptr());  // zero-copy: the mapping itself
  EXPECT_EQ(v.scalar_type(), at::kFloat);
  WeightSource wide = WeightSource::load(t, "ckpt", /*keep_16bit=*/false);
  EXPECT_EQ(wide.get("m", {8, 4}).scalar_type(), at::kFloat);
}

TEST(WeightsDtype, TensorsOffTheAlignmentAskedForAreCopiedAligned) {
  // One float32 element before the matrix puts it 4 bytes past the data section's start.
  const std::string path =
      (std::filesystem::temp_directory_path() / "actcap-align.safetensors").string();
  const at::Tensor m = at::randn({16, 1024});
  write_safetensors(path, {{"a", at::ones({1})}, {"m", m}}, {});
  auto f = SafetensorsFile::open(path);
  const uint8_t* mapped = f->data(*f->find("m"));
  ASSERT_NE(reinterpret_cast<uintptr_t>(mapped) % 64, 0u);
  const at::Tensor in_place = f->tensor("m"), aligned = f->tensor("m", 64);
  EXPECT_EQ(in_place.data_ptr(), static_cast<const void*>(mapped));  // zero-copy
  EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned.data_ptr()) % 64, 0u);
  EXPECT_TRUE(at::equal(aligned, m));
  EXPECT_TRUE(at::equal(f->tensor("m"), m));  // the released pages read back from the file
  std::filesystem::remove(path);
}

TEST(WeightsDtype, WidenedKeepsTheLayoutAndReusesTheScratch) {
  ForwardState st;
  st.widen_scratch = at::empty({64}, at::kFloat);
  const at::Tensor stored = at::randn({4, 8}).to(at::kHalf);
  const at::Tensor transposed = stored.t();  // GPT-2's Conv1D view
  const at::Tensor w = st.in_compute(transposed);
  EXPECT_EQ(w.data_ptr(), st.widen_scratch.data_ptr());
  EXPECT_EQ(w.strides(), transposed.strides());
  EXPECT_TRUE(at::equal(w, transposed.to(at::kFloat)));
  const at::Tensor f = at::randn({2, 2});
  EXPECT_EQ(st.in_compute(f).data_ptr(), f.data_ptr());  // float32: as is
  ForwardState none;                                     // no scratch: a fresh tensor
  EXPECT_TRUE(at::equal(none.in_compute(stored), stored.to(at::kFloat)));
}

TEST(WeightsDtype, PlannerCountsStoredBytesAndTheScratch) {
  auto keep = tiny("llama", at::kBFloat16, WeightsDtype::kKeep);
  auto wide = tiny("llama", at::kBFloat16, WeightsDtype::kF32);
  const auto k = keep->stage_costs(2, 8), w = wide->stage_costs(2, 8);
  ASSERT_EQ(k.size(), w.size());
  const ModelConfig& c = keep->config();
  const auto& p = c.params<LlamaParams>();
  const uint64_t largest_block_matrix = 4 * static_cast<uint64_t>(p.intermediate_size) *
                                        static_cast<uint64_t>(c.hidden_size);  // gate/up/down
  for (size_t i = 0; i < k.size(); ++i) {
    // Embeddings widen only the rows they gather: no scratch.
    if (keep->stage_kind(i) == StageKind::kEmbeddings) {
      EXPECT_EQ(k[i].workspace_bytes, w[i].workspace_bytes);
    }
    if (keep->stage_kind(i) != StageKind::kBlock) continue;
    EXPECT_LT(k[i].weight_bytes, w[i].weight_bytes * 55 / 100);
    EXPECT_EQ(k[i].workspace_bytes, w[i].workspace_bytes + largest_block_matrix);
  }
}

TEST(WeightsDtype, NamesParseAndBadOnesSayTheChoices) {
  EXPECT_EQ(parse_weights_dtype("keep"), WeightsDtype::kKeep);
  EXPECT_EQ(parse_weights_dtype("f32"), WeightsDtype::kF32);
  EXPECT_STREQ(weights_dtype_name(WeightsDtype::kKeep), "keep");
  try {
    parse_weights_dtype("bf16");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("keep, f32"), std::string::npos) << e.what();
  }
}

TEST(InitModel, StreamedCheckpointHasTheBytesOfTheInMemoryWeights) {
  const std::string dir = (std::filesystem::temp_directory_path() / "actcap-init-stream").string();
  std::filesystem::remove_all(dir);
  for (const char* dtype : {"bf16", "f32"}) {
    InitModelOptions o;
    o.arch = "gemma2";
    o.dtype = dtype;
    o.seed = 9;
    const InitModelResult r = init_model(dir, o);
    const ModelConfig c = preset_config("gemma2", "tiny");
    const auto tensors =
        random_weights(c, 9, std::string(dtype) == "bf16" ? at::kBFloat16 : at::kFloat);
    write_safetensors(dir + "/expected.safetensors", {tensors.begin(), tensors.end()}, {});
    EXPECT_EQ(file_bytes(dir + "/model.safetensors"), file_bytes(dir + "/expected.safetensors"))
        << dtype;
    int64_t n = 0;
    for (const auto& [name, t] : tensors) n += t.numel();
    EXPECT_EQ(r.parameters, n);
  }
  std::filesystem::remove_all(dir);
}

// Under ThreadSanitizer OpenMP stays at one thread (libgomp is not instrumented: its barriers
// would read as races), so only the one-thread half runs there.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

TEST(InitModel, RandomWeightsDoNotDependOnTheThreadCount) {
  if (kThreadSanitizer) GTEST_SKIP() << "OpenMP runs one thread under ThreadSanitizer";
  const WeightSpec spec{"model.layers.0.mlp.up_proj.weight", {300, 301}, Init::kMatrix};
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one = random_weight(5, spec);
  at::set_num_threads(std::max(2, threads));
  const at::Tensor many = random_weight(5, spec);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one, many));
  EXPECT_NEAR(one.std().item<double>(), 0.02, 0.001);
}

TEST(InitModel, Llama31EightBIsItsRealSize) {
  const std::string dir = (std::filesystem::temp_directory_path() / "actcap-init-8b").string();
  InitModelOptions o;
  o.arch = "llama";
  o.preset = "llama-3.1-8b";
  o.config_only = true;
  EXPECT_EQ(init_model(dir, o).parameters, 8030261248);  // meta-llama/Llama-3.1-8B: 8.03B
  std::filesystem::remove_all(dir);
}
