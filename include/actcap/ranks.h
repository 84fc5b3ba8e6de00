// Rank and world size of a process launched by a distributed launcher (docs/scale.md): mpirun
// (Open MPI), MPICH/Intel MPI (PMI), srun (Slurm) or torchrun-style variables, or given
// explicitly; and each rank's share of a corpus.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include "actcap/tokenizer.h"

namespace actcap {

struct RankInfo {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;  // on this node (device choice, threads)
  std::string source = "single process";     // where the values came from
  bool ranked() const { return world_size > 1; }
};

// Reads an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// The rank of this process: `rank` / `world_size` when given (>= 0; both or neither), else the
// first launcher found in the environment: OMPI_COMM_WORLD_RANK/SIZE (with _LOCAL_RANK/_SIZE),
// PMI_RANK/SIZE (MPI_LOCALRANKID), SLURM_PROCID/STEP_NUM_TASKS inside an srun step
// (SLURM_LOCALID; a batch script's own SLURM_NTASKS does not count), RANK/WORLD_SIZE
// (LOCAL_RANK, LOCAL_WORLD_SIZE); else a single process. InputError (naming the variables) for
// values that are not integers or a rank outside [0, world size).
RankInfo detect_rank(int rank = -1, int world_size = -1, const EnvLookup& env = process_env());

// The device a rank uses when none is given: cuda:LOCAL_RANK on a machine with CUDA devices, else
// the empty string (the CPU). InputError when the node has fewer CUDA devices than local ranks.
std::string rank_device(const RankInfo& r);

// Rank `rank` of `world_size`'s share of the corpus at `path`: a contiguous range of its lines
// [begin, end) holding about 1/world_size of its tokens. Boundaries are the first documents whose
// running token count reaches k/world_size of the total, so every rank computes the same split
// and the ranks' rows in rank order are the rows of one process. Two streaming passes over the
// corpus; documents that fail to parse are an error unless skipped (as extract does).
// A share's `end` (or `begin`, for an empty share at the end) past every line: "to the end".
constexpr int64_t kPastTheEnd = std::numeric_limits<int64_t>::max();
struct CorpusShare {
  int64_t begin = 0, end = 0;  // 0-based line numbers, end exclusive; kPastTheEnd: to the end
  int64_t documents = 0, tokens = 0;              // this rank's
  int64_t total_documents = 0, total_tokens = 0;  // the corpus'
};
CorpusShare corpus_share(const std::string& path, const Tokenizer* tokenizer, int64_t vocab_size,
                         bool skip_bad_lines, int rank, int world_size);

}  // namespace actcap
