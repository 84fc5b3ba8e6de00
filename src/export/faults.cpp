#include "export/faults.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "actcap/error.h"
#include "actcap/numbers.h"

namespace actcap {

namespace {

std::optional<int64_t> env_index(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  const std::optional<int64_t> n = parse_int64(v);
  if (!n || *n < 0) throw InputError(concat(name, "='", v, "' is not a shard index (0, 1, ...)"));
  return n;
}

struct KillAt {
  std::optional<KillMoment> moment;
  int64_t occurrence = 1;
};

KillAt parse_kill_at() {
  KillAt k;
  const char* v = std::getenv("ACTCAP_KILL_AT");
  if (!v) return k;
  const std::string text = v;
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  if (name == "journal") k.moment = KillMoment::kJournal;
  if (name == "shard-write") k.moment = KillMoment::kShardWrite;
  if (name == "manifest-write") k.moment = KillMoment::kManifestWrite;
  if (name == "resume") k.moment = KillMoment::kResume;
  std::optional<int64_t> n = 1;
  if (colon != std::string::npos) n = parse_int64(text.substr(colon + 1));
  if (!k.moment || !n || *n < 1)
    throw InputError(concat("ACTCAP_KILL_AT='", text,
                            "' is not one of journal:N, shard-write:N, manifest-write:N, resume "
                            "(N from 1)"));
  k.occurrence = *n;
  return k;
}

}  // namespace

bool buffer_fault(BufferFault where, int64_t index) {
  // Read on every call (not once), so that in-process tests can set and clear them.
  const char* name = where == BufferFault::kShardFile   ? "ACTCAP_FAULT_SHARD"
                     : where == BufferFault::kAssembled ? "ACTCAP_FAULT_ASSEMBLED"
                                                        : "ACTCAP_FAULT_QUEUED";
  const std::optional<int64_t> want = env_index(name);
  return want && *want == index;
}

void flip_last_byte(const at::Tensor& t) {
  if (t.numel() == 0) return;
  auto* bytes = static_cast<uint8_t*>(t.data_ptr());
  bytes[t.numel() * t.element_size() - 1] ^= 0x01;
}

void flip_last_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  const char c = static_cast<char>(f.get() ^ 0x01);
  f.seekp(-1, std::ios::end);
  f.put(c);
}

const KillAt& kill_at() {
  static const KillAt at = parse_kill_at();
  return at;
}

void kill_point(KillMoment moment) {
  const KillAt& at = kill_at();
  static std::atomic<int64_t> seen[4];
  if (!at.moment || *at.moment != moment) return;
  if (++seen[static_cast<int>(moment)] == at.occurrence) ::kill(::getpid(), SIGKILL);
}

void check_fault_environment() {
  kill_at();
  for (BufferFault f : {BufferFault::kShardFile, BufferFault::kAssembled, BufferFault::kQueued})
    buffer_fault(f, -1);
}

}  // namespace actcap
