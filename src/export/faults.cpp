#include "export/faults.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>

#include "actcap/error.h"
#include "actcap/numbers.h"

namespace actcap {

void parse_kill_at(const std::string& text, ExportFaults& faults) {
  using Moment = ExportFaults::Moment;
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  std::optional<Moment> moment;
  if (name == "journal") moment = Moment::kJournal;
  if (name == "shard-write") moment = Moment::kShardWrite;
  if (name == "manifest-write") moment = Moment::kManifestWrite;
  if (name == "resume") moment = Moment::kResume;
  if (name == "merge-write") moment = Moment::kMergeWrite;
  if (name == "start") moment = Moment::kStart;
  std::optional<int64_t> n = 1;
  if (colon != std::string::npos) n = parse_int64(text.substr(colon + 1));
  if (!moment || !n || *n < 1)
    throw InputError(concat("kill moment '", text,
                            "' is not one of journal:N, shard-write:N, manifest-write:N, resume, "
                            "merge-write:N, start (N from 1)"),
                     {"kill_at"});
  faults.kill_at = moment;
  faults.kill_occurrence = *n;
}

void FaultPoints::reached(ExportFaults::Moment moment) {
  if (!faults_.kill_at || *faults_.kill_at != moment) return;
  if (++seen_[static_cast<int>(moment)] == faults_.kill_occurrence) ::kill(::getpid(), SIGKILL);
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

}  // namespace actcap
