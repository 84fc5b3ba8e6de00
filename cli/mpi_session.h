// MPI for a ranked `actcap extract` started by mpirun (or srun with PMI): after every rank has
// run its share, rank 0 gathers each rank's outcome and manifest checksum and assembles
// manifest.json, and every rank learns the verdict. Built only where CMake finds MPI
// (ACTCAP_WITH_MPI); elsewhere, and for launches without MPI, the ranks coordinate through the
// output folder (docs/scale.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace actcap::cli {

class MpiSession {
 public:
  // A session when this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
  // PMIX_RANK set) with more than one rank and actcap was built with MPI; else null.
  static std::unique_ptr<MpiSession> start_if_launched();
  static bool built();  // compiled with MPI support
  ~MpiSession();        // MPI_Finalize
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Every rank's `mine`, in rank order, at rank 0 (empty elsewhere).
  std::vector<std::string> gather(const std::string& mine);
  // Rank 0's `value` at every rank.
  std::string broadcast(const std::string& value);

 private:
  MpiSession(int rank, int size) : rank_(rank), size_(size) {}
  int rank_ = 0, size_ = 1;
};

}  // namespace actcap::cli
