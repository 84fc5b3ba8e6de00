#include "actcap/ranks.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <limits>

#include "actcap/error.h"
#include "export/corpus.h"

namespace actcap {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

namespace {

int env_int(const EnvLookup& env, const std::string& name, int fallback) {
  const std::optional<std::string> v = env(name);
  if (!v) return fallback;
  size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v->size() || n < 0 || n > std::numeric_limits<int>::max())
    throw InputError(concat("environment variable ", name, "='", *v,
                            "' is not a non-negative integer (set by the launcher, or by hand: "
                            "fix or unset it)"));
  return static_cast<int>(n);
}

struct Launcher {
  const char *rank, *size, *local_rank, *local_size, *name;
};

}  // namespace

RankInfo detect_rank(int rank, int world_size, const EnvLookup& env) {
  RankInfo r;
  if ((rank >= 0) != (world_size >= 0))
    throw InputError("give both the rank and the world size, or neither", {"rank", "world_size"});
  if (rank >= 0) {
    r.rank = rank;
    r.world_size = world_size;
    r.source = "--rank/--world-size";
    // The node-local rank still comes from the launcher when there is one.
    for (const char* v :
         {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
      if (env(v)) {
        r.local_rank = env_int(env, v, 0);
        break;
      }
  } else {
    static const Launcher launchers[] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI"},
        // Inside an srun step only: a batch script itself also has SLURM_PROCID=0 and the
        // allocation's SLURM_NTASKS, and is one process.
        {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE",
         "Slurm"},
        {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK/WORLD_SIZE"},
    };
    for (const Launcher& l : launchers) {
      if (!env(l.rank) || !env(l.size)) continue;
      r.rank = env_int(env, l.rank, 0);
      r.world_size = env_int(env, l.size, 1);
      r.local_rank = env_int(env, l.local_rank, r.rank);
      // SLURM_STEP_TASKS_PER_NODE may read "2(x3)" or "2,1": then unknown.
      try {
        r.local_world_size = env_int(env, l.local_size, 0);
      } catch (const InputError&) {
        r.local_world_size = 0;
      }
      r.source = concat(l.name, " (", l.rank, "/", l.size, ")");
      break;
    }
  }
  if (r.world_size < 1)
    throw InputError(
        concat("world size must be at least 1, got ", r.world_size, " from ", r.source),
        {"world_size"});
  if (r.rank >= r.world_size)
    throw InputError(concat("rank ", r.rank, " is outside a world of ", r.world_size, " (ranks 0..",
                            r.world_size - 1, ") from ", r.source),
                     {"rank", "world_size"});
  if (r.local_world_size < 1) r.local_world_size = r.ranked() ? 0 : 1;  // 0: not known
  return r;
}

std::string rank_device(const RankInfo& r) {
  if (!r.ranked() || !c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return "";
  const int n = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount();
  if (n <= 0) return "";
  if (r.local_rank >= n)
    throw InputError(
        concat("local rank ", r.local_rank, " (", r.source,
               ") has no GPU of its own: ", "this node has ", n, " CUDA devices; start at most ", n,
               " ranks per node, or give --devices"),
        {"devices"});
  return concat("cuda:", r.local_rank);
}

CorpusShare corpus_share(const std::string& path, const Tokenizer* tokenizer, int64_t vocab_size,
                         bool skip_bad_lines, int rank, int world_size) {
  CorpusShare s;
  {
    CorpusReader reader(path, tokenizer, vocab_size, skip_bad_lines);
    Document doc;
    while (reader.next(doc)) {
      ++s.total_documents;
      s.total_tokens += static_cast<int64_t>(doc.ids.size());
    }
  }
  // Rank k starts at the first document whose preceding tokens reach k/N of the total
  // (integer arithmetic, so every rank agrees): prefix * N >= k * T.
  const auto boundary_reached = [&](int64_t prefix, int k) {
    return static_cast<__int128>(prefix) * world_size >= static_cast<__int128>(k) * s.total_tokens;
  };
  // Rank k's documents are [s_k, s_k+1): s_k is the first document whose prefix reaches k/N of
  // the total; an empty share has begin == end.
  s.begin = s.end = kPastTheEnd;
  CorpusReader reader(path, tokenizer, vocab_size, skip_bad_lines);
  Document doc;
  int64_t prefix = 0;
  bool started = false;
  while (reader.next(doc)) {
    if (!started && boundary_reached(prefix, rank)) {
      started = true;
      s.begin = doc.line;
    }
    if (rank + 1 < world_size && boundary_reached(prefix, rank + 1)) {
      s.end = doc.line;
      break;
    }
    if (started) {
      ++s.documents;
      s.tokens += static_cast<int64_t>(doc.ids.size());
    }
    prefix += static_cast<int64_t>(doc.ids.size());
  }
  return s;
}

}  // namespace actcap
