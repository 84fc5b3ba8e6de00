#include "mpi_session.h"

#include <cstdlib>

#include "actcap/error.h"

#ifdef ACTCAP_WITH_MPI
#include <mpi.h>
#endif

namespace actcap::cli {

bool MpiSession::built() {
#ifdef ACTCAP_WITH_MPI
  return true;
#else
  return false;
#endif
}

#ifdef ACTCAP_WITH_MPI

namespace {
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw RunError(concat("MPI: ", what, " failed (error ", rc, ")"));
}
}  // namespace

std::unique_ptr<MpiSession> MpiSession::start_if_launched() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!size) size = std::getenv("PMI_SIZE");
  if (!size && !std::getenv("PMIX_RANK")) return nullptr;
  if (size && std::atoi(size) <= 1) return nullptr;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n <= 1) {
    MPI_Finalize();
    return nullptr;
  }
  return std::unique_ptr<MpiSession>(new MpiSession(rank, n));
}

MpiSession::~MpiSession() { MPI_Finalize(); }

std::vector<std::string> MpiSession::gather(const std::string& mine) {
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank_ == 0 ? size_ : 0), offsets;
  check(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather");
  std::vector<char> all;
  if (rank_ == 0) {
    int64_t total = 0;
    for (int l : lens) {
      offsets.push_back(static_cast<int>(total));
      total += l;
    }
    if (total > (int64_t{1} << 31) - 1)
      throw RunError(
          "MPI: the ranks' manifests are over 2 GiB together; assemble with actcap merge");
    all.resize(static_cast<size_t>(total));
  }
  check(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR,
                    0, MPI_COMM_WORLD),
        "MPI_Gatherv");
  std::vector<std::string> out;
  for (int r = 0; rank_ == 0 && r < size_; ++r)
    out.emplace_back(all.data() + offsets[r], static_cast<size_t>(lens[r]));
  return out;
}

std::string MpiSession::broadcast(const std::string& value) {
  int len = static_cast<int>(value.size());
  check(MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  std::string out = rank_ == 0 ? value : std::string(static_cast<size_t>(len), '\0');
  check(MPI_Bcast(out.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  return out;
}

#else

std::unique_ptr<MpiSession> MpiSession::start_if_launched() { return nullptr; }
MpiSession::~MpiSession() = default;
std::vector<std::string> MpiSession::gather(const std::string&) { return {}; }
std::string MpiSession::broadcast(const std::string& value) { return value; }

#endif

}  // namespace actcap::cli
