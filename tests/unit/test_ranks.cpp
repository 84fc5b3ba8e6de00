// Ranked extract's pieces (actcap/ranks.h, export/layout.h): which launcher's variables win, bad
// values refused; every rank computes the same token-balanced, contiguous split, whatever the
// world size, covering every document once; the files each writer owns.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "actcap/error.h"
#include "actcap/ranks.h"
#include "export/layout.h"

using namespace actcap;

namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// A .jsonl corpus of documents of the given lengths (blank lines between some of them).
std::string write_corpus(const std::vector<int>& lengths, const std::string& name) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream f(path);
  for (size_t i = 0; i < lengths.size(); ++i) {
    f << "{\"input_ids\": [";
    for (int j = 0; j < lengths[i]; ++j) f << (j ? "," : "") << (j % 50);
    f << "]}\n";
    if (i % 4 == 3) f << "\n";
  }
  return path;
}

}  // namespace

TEST(Ranks, LauncherVariablesInOrderAndFlagsFirst) {
  const auto env = env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                           {"SLURM_PROCID", "5"},
                           {"SLURM_STEP_NUM_TASKS", "8"},
                           {"RANK", "1"},
                           {"WORLD_SIZE", "3"}});
  RankInfo r = detect_rank(-1, -1, env);
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_NE(r.source.find("Open MPI"), std::string::npos);
  r = detect_rank(-1, -1,
                  env_of({{"SLURM_PROCID", "5"},
                          {"SLURM_STEP_NUM_TASKS", "8"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_STEP_TASKS_PER_NODE", "2(x4)"}}));
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 0);  // uneven allocation: not known
  // A batch script (not an srun step) is one process, whatever its allocation's task count.
  EXPECT_FALSE(
      detect_rank(-1, -1, env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "32"}})).ranked());
  r = detect_rank(-1, -1, env_of({{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"LOCAL_RANK", "1"}}));
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 3);
  r = detect_rank(0, 2, env);  // flags win; the local rank still comes from the launcher
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.source, "--rank/--world-size");
  r = detect_rank(-1, -1, env_of({}));
  EXPECT_FALSE(r.ranked());
  EXPECT_EQ(r.local_world_size, 1);
  EXPECT_EQ(rank_device(r), "");  // a single process keeps its devices
}

TEST(Ranks, BadValuesAreInputErrors) {
  EXPECT_THROW(detect_rank(-1, -1, env_of({{"RANK", "1x"}, {"WORLD_SIZE", "3"}})), InputError);
  EXPECT_THROW(detect_rank(-1, -1, env_of({{"RANK", "3"}, {"WORLD_SIZE", "3"}})), InputError);
  EXPECT_THROW(detect_rank(-1, -1, env_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}})), InputError);
  EXPECT_THROW(detect_rank(-1, -1, env_of({{"PMI_RANK", "-1"}, {"PMI_SIZE", "2"}})), InputError);
  EXPECT_THROW(detect_rank(1, -1, env_of({})), InputError);  // both or neither
  EXPECT_THROW(detect_rank(2, 2, env_of({})), InputError);
}

TEST(Ranks, SharesAreContiguousBalancedByTokensAndCoverEveryDocumentOnce) {
  std::vector<int> lengths;
  for (int i = 0; i < 97; ++i) lengths.push_back(1 + (i * 37) % 90);
  lengths[10] = 900;  // one long document
  const std::string path = write_corpus(lengths, "actcap_test_ranks.jsonl");
  int64_t total = 0, longest = 0;
  for (int l : lengths) {
    total += l;
    longest = std::max<int64_t>(longest, l);
  }
  for (int world : {1, 2, 3, 7, 96, 97, 150}) {
    int64_t docs = 0, tokens = 0, expect_begin = 0;
    for (int r = 0; r < world; ++r) {
      const CorpusShare s = corpus_share(path, nullptr, 1000, false, r, world);
      EXPECT_EQ(s.total_tokens, total);
      EXPECT_EQ(s.total_documents, 97);
      docs += s.documents;
      tokens += s.tokens;
      if (s.documents > 0) {
        EXPECT_GE(s.begin, expect_begin) << "world " << world << " rank " << r;
        expect_begin = s.end;
        // Balanced: within one document of total/world (a rank can only be cut at a document).
        EXPECT_LE(std::abs(s.tokens - total / world), longest) << "world " << world;
      }
      if (r + 1 == world) {
        EXPECT_EQ(s.end, std::numeric_limits<int64_t>::max());
      }
    }
    EXPECT_EQ(docs, 97) << "world " << world;
    EXPECT_EQ(tokens, total) << "world " << world;
  }
  std::filesystem::remove(path);
}

TEST(Ranks, LayoutNamesAndOwnership) {
  const OutputLayout single, r1{1, 3};
  EXPECT_EQ(single.manifest(), "manifest.json");
  EXPECT_EQ(single.shard(7), "shard-00007.safetensors");
  EXPECT_EQ(r1.manifest(), "rank-00001-of-00003.json");
  EXPECT_EQ(r1.journal(), "rank-00001-of-00003.journal");
  EXPECT_EQ(r1.shard(7), "shard-r00001-00007.safetensors");
  EXPECT_TRUE(r1.owns("shard-r00001-00007.safetensors"));
  EXPECT_TRUE(r1.owns("shard-r00001-00007.safetensors.tmp.123"));
  EXPECT_TRUE(r1.owns("rank-00001-of-00003.journal"));
  EXPECT_FALSE(r1.owns("shard-r00002-00007.safetensors"));
  EXPECT_FALSE(r1.owns("rank-00001-of-00004.json"));
  EXPECT_FALSE(r1.owns("manifest.json"));
  EXPECT_TRUE(single.owns("rank-00001-of-00003.json"));  // a single process owns every output file
  const auto f = parse_rank_file("rank-00002-of-00005.journal");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 2);
  EXPECT_EQ(f->world_size, 5);
  EXPECT_TRUE(f->journal);
  EXPECT_FALSE(parse_rank_file("rank-2-of-5.jsonx").has_value());
  EXPECT_FALSE(parse_rank_file("rank-00002-of-.json").has_value());
  EXPECT_EQ(shard_rank("shard-r00012-00000.safetensors"), 12);
  EXPECT_FALSE(shard_rank("shard-00012.safetensors").has_value());
}
