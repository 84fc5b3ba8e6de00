// Test-only fault injection for the export path, read from the environment. The
// fault tests (tests/integration/test_faults.py, tests/unit/test_verify.cpp) use these to reach a
// chosen state and prove that each defence catches what it is for; nothing sets them otherwise.
//
//   ACTCAP_FAULT_SHARD=N      flip one bit of shard N's file between its write and its read-back
//   ACTCAP_FAULT_ASSEMBLED=N  flip one bit of shard N's assembled rows before its checksums are
//                             taken (extract checks the assembled rows against the snapshots)
//   ACTCAP_FAULT_QUEUED=N     flip one bit of shard N's rows after its checksums were taken, while
//                             it waits for the writer (the read-back catches it)
//   ACTCAP_KILL_AT=MOMENT     SIGKILL this process at a chosen moment:
//                               journal:N         right after the N-th journal line is synced
//                               shard-write:N     the N-th shard file has its header, not its data
//                               manifest-write:N  the N-th manifest write is half done
//                               resume            --resume took the journal into the manifest and
//                                                 has not yet removed unclaimed files
//                             (N counts from 1 within this process)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace actcap {

enum class BufferFault { kShardFile, kAssembled, kQueued };
// True when the environment asks to damage shard `index` at `where`.
bool buffer_fault(BufferFault where, int64_t index);
// Flips the lowest bit of the last byte of `t` (a CPU tensor), in place.
void flip_last_byte(const at::Tensor& t);
// The same for the last byte of the file at `path`.
void flip_last_byte(const std::string& path);

enum class KillMoment { kJournal, kShardWrite, kManifestWrite, kResume };
// Counts this moment and kills the process with SIGKILL when ACTCAP_KILL_AT names this occurrence.
// An ACTCAP_KILL_AT that names no moment is an InputError.
void kill_point(KillMoment moment);

// Parses every variable above now, so that a misspelt one fails before a run starts (InputError).
void check_fault_environment();

}  // namespace actcap
