#include "actcap/extract.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/ranks.h"
#include "actcap/safetensors.h"
#include "export/corpus.h"
#include "export/faults.h"
#include "export/journal.h"
#include "export/layout.h"
#include "export/merge.h"
#include "export/shard.h"
#include "export/shard_stream.h"
#include "export/stats.h"
#include "io/atomic_file.h"
#include "util/stage_timer.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

std::unique_ptr<Tokenizer> tokenizer_for(const std::string& model_path) {
  if (model_path == "demo") return Tokenizer::byte_level(256);
  const fs::path p = fs::path(model_path) / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(p, ec)) return Tokenizer::from_file(p.string());
  return nullptr;
}

namespace {

// A window of a document: tokens [start, start + ids.size()) of it, exporting `positions`
// (relative to the window) so that every document position is exported exactly once.
struct Window {
  int64_t doc_line = 0;
  int64_t start = 0;
  std::vector<int64_t> ids;
  std::vector<int64_t> positions;
};

// Work for the writer. kWhole: a shard ready to write, its contents (checksums taken from verified
// data) plus what the manifest records. A streamed shard (shard_stream.h) comes as kBegin (its
// rows and points), one kBatch per batch (that batch's rows of every point, plan order, with their
// capture fingerprints) and kEnd (its row indices and what the manifest records).
struct ShardJob {
  enum class Kind { kWhole, kBegin, kBatch, kEnd } kind = Kind::kWhole;
  int64_t index = 0;
  ShardContents contents;
  int64_t first_line = 0, last_line = 0, documents = 0;
  int64_t rows = 0;
  std::vector<PointInfo> plan;
  std::vector<CapturedRows> parts;
  size_t bytes = 0;  // kBatch: the bytes its parts hold
  std::vector<int64_t> row_line, row_pos, row_token;
};

// One batch's rows of one point, with the fingerprint they are checked against.
struct Part {
  at::Tensor rows;
  uint64_t xxh3 = 0;  // chunked_xxh3 (actcap/hash.h)
  // Not yet checked against `xxh3`, the capture's own fingerprint of its one snapshot:
  // assemble_shard checks it, in the same pass that takes the shard's checksums where it can, else
  // first, as SafeCapturer::get() would.
  bool unchecked = false;
};

// The batch's rows of `point`: its one snapshot (fenced) with the capturer's fingerprint, checked
// when the shard is assembled; or (when fingerprints are off or the point fired more than once) a
// verified read with a fingerprint taken now.
Part verified_part(const SafeCapturer& cap, const std::string& point, bool fingerprinted) {
  const Snapshot* only = nullptr;
  int count = 0;
  for (const Snapshot& s : cap.snapshots())  // fenced
    if (s.point == point) {
      only = &s;
      ++count;
    }
  if (fingerprinted && count == 1 && only->rows.device().is_cpu() && only->rows.is_contiguous())
    return Part{only->rows, only->xxh3, /*unchecked=*/true};
  Part part{cap.get(point), 0};  // verified read
  part.xxh3 = fingerprinted && count == 1 ? only->xxh3 : tensor_chunked_xxh3(part.rows);
  return part;
}

// The message of a part whose rows no longer match the fingerprint they were captured with.
RunError changed_part(const std::string& file, const std::string& point, int64_t batch) {
  return RunError(concat(file, ": the assembled rows of '", point, "' (batch ", batch,
                         " of the shard) differ from the verified snapshot they were copied "
                         "from; the shard was not written (check the machine's memory, then "
                         "resume the run)"),
                  {"resume"});
}

// Rows already in (document line, position) order (the usual case: documents of one length, or
// longest first): each point's tensor is its parts back to back, so the shard holds the parts as
// pieces (written as they are, never copied into one tensor) and one pass over each part's bytes
// takes the tensor's checksum and, chunk by chunk right after, the part's fingerprint, which must
// equal the one taken at capture. The checksums then follow from bytes proven to be the captured
// ones; a change after that pass fails the writer's read-back. Points in parallel.
void assemble_in_order(ShardContents& c, const std::vector<PointInfo>& plan,
                       const std::map<std::string, std::vector<Part>>& parts, int64_t index,
                       const ExportFaults& faults, const std::string& file) {
  const size_t points = plan.size();
  c.pieces.assign(points + 3, {});
  for (size_t k = 0; k < points; ++k) {
    const std::vector<Part>& ps = parts.at(plan[k].name);
    std::vector<int64_t> shape = ps.front().rows.sizes().vec();
    shape[0] = 1;
    at::Tensor one_row = at::empty(shape, ps.front().rows.options());
    shape[0] = c.rows;
    c.tensors.emplace_back(plan[k].name, one_row.expand(shape));
    for (const Part& part : ps) c.pieces[k].push_back(part.rows);
  }
  if (names_shard(faults.damage_assembled, index) && points > 0)
    flip_last_byte(c.pieces.front().back());  // test-only: before the checksums are taken
  std::vector<uint64_t> sums(points, 0);
  std::vector<int64_t> bad_batch(points, -1);
  at::parallel_for(0, static_cast<int64_t>(points), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      Xxh3Stream stream;
      const std::vector<Part>& ps = parts.at(plan[k].name);
      for (size_t b = 0; b < ps.size(); ++b) {
        const at::Tensor& rows = ps[b].rows;
        const uint64_t fp = stream_and_fingerprint(
            rows.data_ptr(), static_cast<size_t>(rows.numel()) * rows.element_size(), stream);
        if (fp != ps[b].xxh3 && bad_batch[k] < 0) bad_batch[k] = static_cast<int64_t>(b);
      }
      sums[k] = stream.digest();
    }
  });
  for (size_t k = 0; k < points; ++k)
    if (bad_batch[k] >= 0) throw changed_part(file, plan[k].name, bad_batch[k]);
  for (size_t k = 0; k < points; ++k) c.checksums[plan[k].name] = hex64(sums[k]);
}

// Shard `index`: every point's rows (its parts, batch after batch) in (document line, position)
// order, plus the row-index tensors. Checksums are taken first, then the assembled rows are checked
// against the fingerprints of the verified parts they were copied from: a change before the check
// fails it, a change after it fails the writer's read-back, so the checksums follow from verified
// data. RunError names the shard and the point.
ShardContents assemble_shard(int64_t index, const std::vector<PointInfo>& plan,
                             const std::map<std::string, std::vector<Part>>& parts,
                             const std::vector<int64_t>& row_line,
                             const std::vector<int64_t>& row_pos,
                             const std::vector<int64_t>& row_token, const ExportFaults& faults,
                             const std::string& file) {
  const int64_t n = static_cast<int64_t>(row_line.size());
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  const auto before = [&](int64_t a, int64_t b) {
    return row_line[a] != row_line[b] ? row_line[a] < row_line[b] : row_pos[a] < row_pos[b];
  };
  ShardContents c;
  c.rows = n;
  // (line, position) is unique per row, so rows already sorted sort to the identity.
  bool in_order = std::is_sorted(perm.begin(), perm.end(), before);
  for (const PointInfo& p : plan)
    for (const Part& part : parts.at(p.name))
      in_order = in_order && part.unchecked && part.rows.dim() >= 1;
  if (in_order && !plan.empty()) {
    assemble_in_order(c, plan, parts, index, faults, file);
    c.tensors.emplace_back("__rows__.seq", at::tensor(row_line, at::kLong));
    c.tensors.emplace_back("__rows__.pos", at::tensor(row_pos, at::kLong));
    c.tensors.emplace_back("__rows__.token", at::tensor(row_token, at::kLong));
    for (size_t k = plan.size(); k < c.tensors.size(); ++k)
      c.checksums[c.tensors[k].first] = hex64(tensor_xxh3(c.tensors[k].second));
    return c;
  }
  // Otherwise: the parts checked first against their capture fingerprints (what
  // SafeCapturer::get() checks), then gathered in order.
  for (const PointInfo& p : plan) {
    int64_t batch = 0;
    for (const Part& part : parts.at(p.name)) {
      if (part.unchecked && tensor_chunked_xxh3(part.rows) != part.xxh3)
        throw changed_part(file, p.name, batch);
      ++batch;
    }
  }
  std::sort(perm.begin(), perm.end(), before);
  std::vector<int64_t> inverse(n);
  for (int64_t i = 0; i < n; ++i) inverse[perm[i]] = i;
  const at::Tensor order = at::tensor(perm, at::kLong), back = at::tensor(inverse, at::kLong);

  for (const PointInfo& p : plan) {
    std::vector<at::Tensor> rows;
    for (const Part& part : parts.at(p.name)) rows.push_back(part.rows);
    c.tensors.emplace_back(p.name, at::cat(rows, 0).index_select(0, order));
  }
  c.tensors.emplace_back("__rows__.seq", at::tensor(row_line, at::kLong).index_select(0, order));
  c.tensors.emplace_back("__rows__.pos", at::tensor(row_pos, at::kLong).index_select(0, order));
  c.tensors.emplace_back("__rows__.token", at::tensor(row_token, at::kLong).index_select(0, order));
  if (names_shard(faults.damage_assembled, index)) flip_last_byte(c.tensors.front().second);
  c.checksums = tensor_checksums(c.tensors);

  for (size_t k = 0; k < plan.size(); ++k) {
    int64_t offset = 0, batch = 0;
    for (const Part& part : parts.at(plan[k].name)) {
      const int64_t rows = part.rows.size(0);
      const at::Tensor copied =
          c.tensors[k].second.index_select(0, back.slice(0, offset, offset + rows));
      if (tensor_chunked_xxh3(copied) != part.xxh3) throw changed_part(file, plan[k].name, batch);
      offset += rows;
      ++batch;
    }
  }
  const int64_t* seq = c.tensors[plan.size()].second.data_ptr<int64_t>();
  const int64_t* pos = c.tensors[plan.size() + 1].second.data_ptr<int64_t>();
  const int64_t* tok = c.tensors[plan.size() + 2].second.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    if (seq[i] != row_line[perm[i]] || pos[i] != row_pos[perm[i]] || tok[i] != row_token[perm[i]])
      throw RunError(concat(file, ": assembled row ", i,
                            " does not carry the line, position and token it was captured at; the "
                            "shard "
                            "was not written"));
  return c;
}

// The entries of `source` that list the run's shards 0, 1, 2, ... in order, each once: an entry for
// a shard already listed is a journal line the manifest took in before a resume was killed (the
// same entry: resuming verified it), skipped; anything else is not this run's list.
EntrySource in_shard_order(const OutputLayout& layout, EntrySource source) {
  return [layout, source = std::move(source)](const EntryVisitor& each) {
    int64_t next = 0;
    source([&](const json& e) {
      const std::string file = e.is_object() ? e.value("file", std::string()) : std::string();
      const std::optional<int64_t> index = layout.shard_index(file);
      if (index && *index < next) return;
      if (!index || *index != next)
        throw RunError(concat("the run's shard list names ", file.empty() ? "no file" : file,
                              " where it should name ", layout.shard(next),
                              "; run actcap verify on the folder"));
      ++next;
      each(e);
    });
  };
}

// Writes shards on its own thread behind a bounded queue, claiming each in the journal once it
// reads back intact; the manifest takes them all in when the run completes.
class ShardWriter {
 public:
  // `manifest`: the run's manifest as written at its start, without its shard list; `claimed`:
  // the entries that list holds (a resumed run's). `capacity`: whole shards queued before push()
  // blocks; batches of streamed shards are held up to `capacity` x `shard_bytes` bytes.
  ShardWriter(std::string dir, json manifest, EntryTally claimed, ShardSchema schema,
              size_t capacity, uint64_t shard_bytes, FaultPoints& faults, OutputLayout layout)
      : dir_(std::move(dir)),
        manifest_(std::move(manifest)),
        claimed_(std::move(claimed)),
        schema_(std::move(schema)),
        capacity_(capacity),
        batch_bytes_limit_(std::max<uint64_t>(1, capacity) * shard_bytes),
        faults_(faults),
        layout_(layout),
        journal_(dir_, &faults, layout_.journal()),
        thread_([this] { loop(); }) {}
  ~ShardWriter() {
    try {
      finish();
    } catch (...) {  // the run is already failing; its own error is the one to report
    }
  }

  // Blocks while the queue is full. Rethrows the writer's failure, if any.
  void push(ShardJob job) {
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [&] {
      if (error_) return true;
      switch (job.kind) {
        case ShardJob::Kind::kWhole:
          return whole_queued_ < capacity_;
        case ShardJob::Kind::kBatch:
          return batch_bytes_ == 0 || batch_bytes_ + job.bytes <= batch_bytes_limit_;
        default:
          return true;
      }
    });
    if (error_) std::rethrow_exception(error_);
    if (job.kind == ShardJob::Kind::kWhole) ++whole_queued_;
    batch_bytes_ += job.bytes;
    queue_.push_back(std::move(job));
    ready_.notify_one();
  }

  // Drains the queue and stops the thread; rethrows the writer's failure.
  void finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      ready_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

  // Marks the run complete (after finish()), with the statistics of every claimed shard merged
  // into stats.safetensors first when the run keeps them (a rank's are merged with the other
  // ranks' when manifest.json is assembled). The shard list is never held: the manifest's text is
  // streamed from the manifest the run started from and the journal, and must list exactly the
  // shards the run claimed. Returns the manifest_checksum sealed.
  std::string complete(const json& extra) {
    const std::string path = (fs::path(dir_) / layout_.manifest()).string();
    std::string problem;
    const std::optional<json> started = manifest_outline(path, problem);
    if (!started) throw RunError(concat(path, " ", problem, "; resume the run"));
    const EntrySource shards = in_shard_order(
        layout_,
        in_turn({manifest_entries(path, *started), journal_entries(dir_, layout_.journal())}));
    if (schema_.stats && !layout_.ranked())
      manifest_["stats"] = write_merged_stats(dir_, shards, schema_, &faults_);
    for (const auto& [k, v] : extra.items()) manifest_[k] = v;
    manifest_["complete"] = true;
    const std::string sealed =
        write_manifest_streamed(dir_, manifest_, shards, &claimed_, &faults_, layout_.manifest());
    journal_.remove();
    return sealed;
  }

  uint64_t bytes_written() const { return bytes_.load(); }

  // The shard's statistics per point, from its assembled (verified, ordered) rows; under
  // --stats-only the rows themselves are then dropped.
  void add_stats(ShardContents& c) const {
    materialize_pieces(c);
    std::map<std::string, at::Tensor> by_name(c.tensors.begin(), c.tensors.end());
    std::vector<std::pair<std::string, at::Tensor>> stats;
    for (const auto& [point, shape] : schema_.stat_points)
      stats_tensors(
          point,
          stats_of(by_name.at(point), by_name.at("__rows__.seq"), by_name.at("__rows__.pos"),
                   by_name.at("__rows__.token"), schema_.stats_top_k),
          stats);
    if (!schema_.stats_stored) {
      c.tensors.clear();
      c.checksums = json::object();
    }
    const json sums = tensor_checksums(stats);
    for (const auto& [name, sum] : sums.items()) c.checksums[name] = sum;
    for (auto& t : stats) c.tensors.push_back(std::move(t));
  }

  int64_t shards_written() const { return shards_.load(); }

 private:
  void loop() {
    for (;;) {
      ShardJob job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait(lock, [&] { return !queue_.empty() || done_; });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
        if (job.kind == ShardJob::Kind::kWhole) {
          --whole_queued_;
          space_.notify_one();
        }
      }
      try {
        switch (job.kind) {
          case ShardJob::Kind::kWhole:
            write(job);  // may add the shard's statistics to its contents
            break;
          case ShardJob::Kind::kBegin:
            stream_plan_ = job.plan;
            stream_ = std::make_unique<StreamedShard>(dir_, layout_.shard(job.index), job.index,
                                                      stream_plan_, job.rows, schema_, &faults_);
            break;
          case ShardJob::Kind::kBatch:
            write_batch(job);
            break;
          case ShardJob::Kind::kEnd:
            write(job);
            break;
        }
      } catch (...) {
        stream_.reset();  // an unfinished streamed shard's temp file goes with it
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
        queue_.clear();
        whole_queued_ = 0;
        batch_bytes_ = 0;
        space_.notify_all();
        return;
      }
      if (job.kind == ShardJob::Kind::kBatch) {
        job.parts.clear();  // the snapshots' memory goes back before the forward needs it
        std::lock_guard<std::mutex> lock(mu_);
        batch_bytes_ -= job.bytes;
        space_.notify_one();
      }
    }
  }

  void write_batch(const ShardJob& job) {
    StageTimer batch_timer("writer.batch");
    if (!stream_) throw RunError("a batch came for no shard (internal error)");
    const int bad = stream_->add_batch(job.parts);
    if (bad >= 0)
      throw changed_part(layout_.shard(job.index), stream_plan_[static_cast<size_t>(bad)].name,
                         stream_->batches());
  }

  // A streamed shard's end: its rows checked in order, then StreamedShard::finish().
  json finish_stream(ShardJob& job) {
    if (!stream_) throw RunError("a shard ended that never began (internal error)");
    for (size_t i = 1; i < job.row_line.size(); ++i)
      if (job.row_line[i - 1] > job.row_line[i] ||
          (job.row_line[i - 1] == job.row_line[i] && job.row_pos[i - 1] >= job.row_pos[i]))
        throw RunError(concat(layout_.shard(job.index), ": row ", i,
                              " came out of (line, position) order; the shard was not written "
                              "(internal error)"));
    json entry = stream_->finish(job.row_line, job.row_pos, job.row_token);
    stream_.reset();
    job.contents.rows = static_cast<int64_t>(job.row_line.size());
    return entry;
  }

  // A whole shard (kWhole), or the end of a streamed one (kEnd): written, read back, claimed.
  void write(ShardJob& job) {
    const bool whole = job.kind == ShardJob::Kind::kWhole;
    if (whole && names_shard(faults_.faults().damage_queued, job.index))
      flip_last_byte(held_as_pieces(job.contents, 0) ? job.contents.pieces.front().back()
                                                     : job.contents.tensors.front().second);
    StageTimer write_timer("writer.shard");
    if (whole && schema_.stats) add_stats(job.contents);
    json entry =
        job.kind == ShardJob::Kind::kEnd
            ? finish_stream(job)
            : write_checked_shard(dir_, job.index, job.contents, schema_, &faults_, layout_);
    entry["first_line"] = job.first_line;
    entry["last_line"] = job.last_line;
    entry["documents"] = job.documents;
    journal_.append(entry);  // claimed from here on
    claimed_.add(entry);
    manifest_["rows"] = manifest_.value("rows", 0) + job.contents.rows;
    bytes_ += entry["bytes"].get<uint64_t>();
    ++shards_;
  }

  std::string dir_;
  json manifest_;       // without its shard list
  EntryTally claimed_;  // every shard entry of the run: the manifest's and the journal's
  ShardSchema schema_;
  size_t capacity_;
  uint64_t batch_bytes_limit_;
  size_t whole_queued_ = 0;
  uint64_t batch_bytes_ = 0;
  std::unique_ptr<StreamedShard> stream_;  // writer thread only
  std::vector<PointInfo> stream_plan_;
  FaultPoints& faults_;
  OutputLayout layout_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<ShardJob> queue_;
  bool done_ = false;
  std::exception_ptr error_;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> shards_{0};
  JournalWriter journal_;
  std::thread thread_;
};

json read_manifest(const std::string& dir, const std::string& file) {
  const std::string path = (fs::path(dir) / file).string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw InputError(concat("cannot resume: ", dir, " has no ", file, " to resume from"),
                     {"resume"});
  // Without its shard entries: verify_output hands back the claimed ones (one copy of the list).
  std::string problem;
  std::optional<json> outline = manifest_outline(path, problem);
  if (!outline) throw InputError(concat("cannot resume: ", path, " ", problem), {"resume"});
  json m = std::move(*outline);
  // The fields resuming reads, with their types, before anything reads them.
  const char* wrong =
      !m.is_object()                                    ? "not an object"
      : !m.contains("model") || !m["model"].is_object() ? "no model"
      : !m["model"].contains("fingerprint") || !m["model"]["fingerprint"].is_string()
          ? "no model fingerprint"
      : !m.contains("shards") || !m["shards"].is_array()       ? "no shard list"
      : !m.contains("complete") || !m["complete"].is_boolean() ? "no completion state"
                                                               : nullptr;
  if (wrong)
    throw InputError(concat("cannot resume: ", path, " is not an actcap extract manifest (", wrong,
                            "); overwrite it to start again"),
                     {"resume", "overwrite"});
  return m;
}

// The longest window a run cuts documents into: the options' max length (else the model's
// context), after checking the options against it.
int64_t checked_max_length(const ExtractOptions& o, int64_t context) {
  const int64_t max_len = o.max_length > 0 ? o.max_length : context;
  if (max_len > context)
    throw InputError(concat("max length ", max_len, " exceeds the model's context of ", context),
                     {"max_length"});
  if (o.stride < 0 || o.stride > max_len)
    throw InputError(
        concat("stride ", o.stride, " must be between 1 and the max length (", max_len, ")"),
        {"stride", "max_length"});
  if (o.batch_size <= 0) throw InputError("batch size must be positive", {"batch_size"});
  if (o.resume && o.overwrite)
    throw InputError("resuming and overwriting exclude each other", {"resume", "overwrite"});
  return max_len;
}

// What a resumed run must agree on to produce the same files.
struct RunIdentity {
  json head;      // manifest_head: format, model, device map, points
  json settings;  // the options that shape the shards
  json input;     // the corpus: path and XXH3
  json rank;      // a ranked run: rank, world_size, lines [begin, end) of its share
};

RunIdentity run_identity(const Model& model, const SafeCapturer* cap, const ExtractOptions& o,
                         int64_t max_len, const CorpusShare* share) {
  RunIdentity id;
  if (share) {
    const auto line = [](int64_t l) { return l == kPastTheEnd ? json() : json(l); };
    id.rank = {{"rank", o.rank},
               {"world_size", o.world_size},
               {"lines", {line(share->begin), line(share->end)}}};
  }
  id.head = manifest_head(model, cap ? cap->plan() : std::vector<PointInfo>{});
  if (!id.rank.is_null()) id.head["rank"] = id.rank;
  id.settings = {{"capture", o.capture.patterns}, {"batch_size", o.batch_size},
                 {"max_length", max_len},         {"stride", o.stride},
                 {"shard_bytes", o.shard_bytes},  {"skip_bad_lines", o.skip_bad_lines}};
  if (!o.capture.attention_heads.empty())
    id.settings["attention_heads"] = o.capture.attention_heads;
  if (o.stats) {  // the shards then hold statistics too (shard_schema reads "stats")
    id.head["stats"] = {{"top_k", o.stats_top_k}, {"stored", !o.stats_only}};
    id.settings["stats"] = id.head["stats"];
  }
  if (o.skip_special) id.settings["skip_special"] = true;
  id.input = {{"path", o.input}, {"xxh3", CorpusReader::fingerprint(o.input)}};
  return id;
}

// Where the run starts writing: its manifest, the next shard's index and the last input line
// already claimed (-1: none).
struct StartPoint {
  json manifest;       // without its shard list
  EntryTally claimed;  // the shard entries it lists
  int64_t next_shard = 0;
  int64_t resume_after = -1;
};

// --resume: checks that the run in o.out is this run and that everything it claims is intact, takes
// the journal into the manifest and removes whatever of ours is not claimed.
StartPoint resume_run(const ExtractOptions& o, const Model& model, const RunIdentity& id,
                      const OutputLayout& layout, FaultPoints& faults) {
  StartPoint start;
  json& manifest = start.manifest;
  manifest = read_manifest(o.out, layout.manifest());
  if (manifest.value("format", json()) != id.head["format"])
    throw InputError(concat("cannot resume: ", o.out, " was written in format ",
                            manifest.value("format", json()).dump(), ", this actcap writes ",
                            id.head["format"].dump(),
                            " (rows carry __rows__.token since actcap/3); overwrite it to start "
                            "again"),
                     {"resume", "overwrite"});
  for (const char* key : {"settings", "points", "input", "rank"}) {
    const json& want = std::string(key) == "settings" ? id.settings
                       : std::string(key) == "points" ? id.head["points"]
                       : std::string(key) == "rank"   ? id.rank
                                                      : id.input;
    if (manifest.value(key, json()) != want)
      throw InputError(concat("cannot resume: ", key, " differ from the run in ", o.out, " (",
                              manifest.value(key, json()).dump(), " there, ", want.dump(),
                              " now); overwrite it to start again"),
                       {"resume", "overwrite"});
  }
  if (manifest["model"].value("fingerprint", "") != model.fingerprint())
    throw InputError(concat("cannot resume: ", o.out,
                            " was written from other weights; overwrite it to start again"),
                     {"resume", "overwrite"});
  // Keep exactly the shards the manifest (and its journal) claims, after checking them all;
  // drop anything else. The claimed list is streamed, never held: extract writes shards 0, 1, 2,
  // ... in order, so the list is checked to name exactly those and counted.
  EntryTally claimed;
  int64_t rows = 0;
  std::string malformed;  // the first entry resuming cannot continue from
  const json on_disk = manifest;
  VerifyReport check = verify_output(o.out, layout, [&](const json& s) {
    claimed.add(s);
    if (!malformed.empty()) return;
    const std::string file = s.is_object() ? s.value("file", "?") : "?";
    if (!s.is_object() || !s.contains("last_line") || !s["last_line"].is_number_integer() ||
        !s.contains("rows") || !s["rows"].is_number_integer())
      malformed = concat("shard entry ", file, " in ", o.out,
                         " has no integer rows/last_line: not written by extract");
    else if (layout.shard_index(file) != std::optional<int64_t>(start.next_shard))
      malformed = concat("shard entry ", claimed.count(), " in ", o.out, " names ", file, ", not ",
                         layout.shard(start.next_shard), ": not written by extract in order");
    if (!malformed.empty()) return;
    start.resume_after = s["last_line"].get<int64_t>();
    rows += s["rows"].get<int64_t>();
    ++start.next_shard;
  });
  for (const VerifyIssue& i : check.issues)
    if (i.kind != VerifyIssue::Kind::kIncomplete)
      throw RunError(concat("cannot resume: ", o.out, "/", i.file,
                            (i.tensor.empty() ? "" : " " + i.tensor), ": ", i.problem),
                     {"resume"});
  if (!malformed.empty())
    throw InputError(concat("cannot resume: ", malformed, "; overwrite it to start again"),
                     {"resume", "overwrite"});
  // An unfinished rank's run is not the one a manifest.json in the folder was assembled from (a
  // new run's rank killed after writing its head, before removing it: start_run): it goes before
  // this rank changes any file it may list.
  if (layout.ranked() && on_disk.value("complete", false) != true) {
    std::error_code ec;
    fs::remove(fs::path(o.out) / kManifestName, ec);
  }
  // The manifest takes in the journal's entries first; only then is the journal dropped,
  // with anything else of ours that is not claimed.
  manifest["complete"] = false;
  manifest["rows"] = rows;
  const std::string path = (fs::path(o.out) / layout.manifest()).string();
  write_manifest_streamed(
      o.out, manifest,
      in_shard_order(layout, in_turn({manifest_entries(path, on_disk),
                                      journal_entries(o.out, layout.journal())})),
      &claimed, &faults, layout.manifest());
  faults.reached(ExportFaults::Moment::kResume);
  for (const auto& e : fs::directory_iterator(o.out)) {
    const std::string n = e.path().filename().string();
    const std::optional<int64_t> index = layout.shard_index(n);
    const bool kept = n == layout.manifest() || (index && *index < start.next_shard);
    if (!kept && layout.owns(n)) fs::remove(e.path());
  }
  start.claimed = std::move(claimed);
  return start;
}

// The files in `dir` that stop rank `layout` of a new run from starting there: a dataset
// (manifest.json), its own files from an earlier run, and anything else of actcap's that is not
// a sibling rank's (another world size's rank files, a single process's shards and journal,
// statistics, shards of ranks past the world size). InputError naming one of them without
// `overwrite`; with it, the ones this rank removes: rank 0 the strangers', each rank its own.
std::vector<fs::path> prepare_rank_output(const std::string& dir, const OutputLayout& layout,
                                          bool overwrite) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(concat("output folder ", dir, " exists and is not a folder"), {"out"});
  fs::create_directories(dir, ec);
  if (ec)
    throw InputError(concat("cannot create output folder ", dir, ": ", ec.message()), {"out"});
  const auto sibling = [&](const std::string& n) {
    if (const auto f = parse_rank_file(n)) return f->world_size == layout.world_size;
    if (const auto r = shard_rank(n)) return *r < layout.world_size;
    return false;
  };
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_regular_file() || !is_output_file(n) || n == kManifestName) continue;
    const bool mine = layout.owns(n), stranger = !mine && !sibling(n);
    if (!mine && !stranger) continue;
    if (!overwrite && n != temp_target(n))
      throw InputError(concat("output folder ", dir, " already holds ", n,
                              ", a temp file left by a process killed while writing ",
                              temp_target(n), "; remove it, or allow overwriting"),
                       {"out", "overwrite"});
    if (!overwrite)
      throw InputError(
          concat("output folder ", dir, " already holds ", n,
                 stranger && parse_rank_file(n)
                     ? concat(", from a run of ", parse_rank_file(n)->world_size,
                              " ranks (this one has ", layout.world_size,
                              "): resume that run with its world size, or overwrite it")
                     : std::string("; resume that run, or allow overwriting to replace it")),
          {"out", "overwrite", "resume"});
    // Its manifest is replaced by the new head, its journal removed before it (start_run).
    if ((mine || layout.rank == 0) && n != layout.manifest() && n != layout.journal())
      stale.push_back(e.path());
  }
  if (!overwrite && fs::exists(fs::path(dir) / kManifestName, ec))
    throw InputError(concat("output folder ", dir, " already holds ", kManifestName,
                            "; resume that run, or allow overwriting to replace it"),
                     {"out", "overwrite", "resume"});
  return stale;
}

// A new run: prepares o.out and writes the manifest's head.
StartPoint start_run(const ExtractOptions& o, const RunIdentity& id, const OutputLayout& layout,
                     FaultPoints& faults) {
  std::vector<fs::path> stale;
  if (layout.ranked())
    stale = prepare_rank_output(o.out, layout, o.overwrite);
  else
    prepare_output_dir(o.out, o.overwrite);
  StartPoint start;
  start.manifest = id.head;
  start.manifest["settings"] = id.settings;
  start.manifest["input"] = id.input;
  std::error_code ec;
  const bool replacing = layout.ranked() && o.overwrite;  // an earlier run's files, this rank's
  // The earlier run's journal first: it claims shards for that run, and a --resume after a kill
  // below would otherwise take them into this one (no manifest.json lists a journal's shards).
  if (replacing) fs::remove(fs::path(o.out) / layout.journal(), ec);
  write_manifest(o.out, start.manifest, &faults, layout.manifest());
  if (replacing) {
    faults.reached(ExportFaults::Moment::kStart);
    // In this order: the head above replaced this rank's manifest, then the dataset's
    // manifest.json goes, which may list the files removed next (left, it would look complete
    // while its shards are gone). A rank assembling the earlier run from this rank's old manifest
    // sees it replaced when it looks again and removes the manifest.json it wrote; one that
    // looked before the head was written has it removed here (merge_ranks).
    fs::remove(fs::path(o.out) / kManifestName, ec);
    for (const fs::path& p : stale) fs::remove(p, ec);
  }
  return start;
}

// --resume into a folder written by another number of processes is refused, naming the number.
void check_world_size(const std::string& dir, const OutputLayout& layout) {
  std::error_code ec;
  for (const auto& [world, ranks] : rank_manifests(dir))
    if (world != layout.world_size)
      throw InputError(
          concat("cannot resume: ", dir, " was written by ", world, " ranks (rank-*-of-", world,
                 ".json), this run has ", layout.world_size,
                 layout.world_size == 1 ? " process" : " ranks", ": resume with --world-size ",
                 world, " (under its launcher), or overwrite it to start again"),
          {"resume", "world_size", "overwrite"});
  if (!layout.ranked()) return;
  const fs::path assembled = fs::path(dir) / kManifestName;
  if (!fs::exists(assembled, ec)) return;
  std::string problem;  // without its shard list: only world_size is read
  const std::optional<json> outline = manifest_outline(assembled.string(), problem);
  if (!outline) return;  // damaged: the ranks' own manifests decide; merge rewrites it
  const json& m = *outline;
  if (m.is_object() && m.value("world_size", json(1)) != json(layout.world_size))
    throw InputError(
        concat("cannot resume: ", dir, " was written by ", m.value("world_size", json(1)).dump(),
               " process(es), this run has ", layout.world_size,
               " ranks: resume it as it was run, or overwrite it to start again"),
        {"resume", "world_size", "overwrite"});
}

// The writer for the run's shards, with the schema of its manifest.
std::unique_ptr<ShardWriter> open_writer(const ExtractOptions& o, const json& manifest,
                                         EntryTally claimed, const OutputLayout& layout,
                                         FaultPoints& faults) {
  std::string problem;
  std::optional<ShardSchema> schema = shard_schema(manifest, problem);
  if (!schema)
    throw InputError(
        concat(o.out, "/", layout.manifest(), " ", problem, "; overwrite it to start again"),
        {"overwrite"});
  return std::make_unique<ShardWriter>(o.out, manifest, std::move(claimed), std::move(*schema),
                                       static_cast<size_t>(o.queue_shards), o.shard_bytes, faults,
                                       layout);
}

// One shard's worth of whole documents, cut into windows.
struct ShardInput {
  std::vector<Window> windows;
  int64_t first_line = -1, last_line = -1, documents = 0;
};

// The lines [begin, end) a rank reads (all of them for a single process).
struct LineRange {
  int64_t begin = 0, end = kPastTheEnd;
};

// Reads whole documents until their captured rows reach the shard size (or the input, or the
// rank's share of it, ends, which clears `more`), skipping lines up to `resume_after` (counted as
// done). Cuts each document into windows of at most `max_len` tokens, starting every stride
// tokens.
ShardInput gather_shard(CorpusReader& reader, Document& doc, bool& more, const ExtractOptions& o,
                        int64_t max_len, int64_t bytes_per_row, int64_t resume_after,
                        const LineRange& lines, const std::set<int64_t>& skip_tokens,
                        ExtractProgress& progress) {
  ShardInput in;
  int64_t shard_bytes = 0;
  while (shard_bytes < static_cast<int64_t>(o.shard_bytes) && (more = reader.next(doc))) {
    if (doc.line >= lines.end) {  // the next rank's (the reader starts at lines.begin: skip_to)
      more = false;
      break;
    }
    if (doc.line <= resume_after) {
      ++progress.documents_done;
      continue;
    }
    const int64_t len = static_cast<int64_t>(doc.ids.size());
    if (len > max_len && o.stride == 0)
      throw InputError(concat(o.input, ":", doc.line + 1, ": document has ", len,
                              " tokens, over the max length of ", max_len,
                              "; set a stride to cut long documents into overlapping windows"),
                       {"max_length", "stride"});
    std::vector<int64_t> keep = o.capture.positions.select(len);
    if (!skip_tokens.empty())  // --skip-special: those tokens are run, never stored or counted
      keep.erase(std::remove_if(keep.begin(), keep.end(),
                                [&](int64_t p) { return skip_tokens.count(doc.ids[p]) > 0; }),
                 keep.end());
    int64_t covered = 0;
    for (int64_t start = 0;; start += o.stride) {
      const int64_t end = std::min(len, start + max_len);
      Window w{doc.line,
               start,
               std::vector<int64_t>(doc.ids.begin() + start, doc.ids.begin() + end),
               {}};
      for (int64_t p : keep)
        if (p >= covered && p < end) w.positions.push_back(p - start);
      covered = end;
      shard_bytes += static_cast<int64_t>(w.positions.size()) * bytes_per_row;
      in.windows.push_back(std::move(w));
      if (end == len) break;
    }
    if (in.first_line < 0) in.first_line = doc.line;
    in.last_line = doc.line;
    ++in.documents;
  }
  return in;
}

// One shard's captured rows: each point's verified parts, batch after batch, and the document
// line and position of each row.
struct ShardRows {
  std::map<std::string, std::vector<Part>> parts;
  std::vector<int64_t> row_line, row_pos, row_token;
};

// The order the windows run in: grouped by length, longest first (so padding stays small).
std::vector<size_t> batch_order(const std::vector<Window>& windows) {
  std::vector<size_t> order(windows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return windows[a].ids.size() > windows[b].ids.size();
  });
  return order;
}

// The number of rows the windows' batches capture when they come out in (document line,
// position) order (each window's positions in turn, windows in batch order: SafeCapturer's row
// order), else -1: then each point's tensor is its batches' rows back to back, and the shard can
// be written as the batches complete (StreamedShard).
int64_t rows_in_order(const std::vector<Window>& windows) {
  int64_t rows = 0, line = -1, pos = -1;
  for (size_t k : batch_order(windows))
    for (int64_t p : windows[k].positions) {
      const int64_t at = windows[k].start + p;
      if (windows[k].doc_line < line || (windows[k].doc_line == line && at <= pos)) return -1;
      line = windows[k].doc_line;
      pos = at;
      ++rows;
    }
  return rows;
}

// ACTCAP_STREAM=0 writes every shard whole, after its last batch (for measuring and for the tests
// that compare both ways: the files are the same).
bool streaming_allowed() {
  const char* e = std::getenv("ACTCAP_STREAM");
  return !(e && std::string(e) == "0");
}

// One batch's verified parts, plan order, and its row count, handed on as soon as it is captured.
using BatchSink = std::function<void(std::vector<Part>&&, int64_t)>;

// Runs the windows in batches (batch_order), capturing with `cap` (or, without one, only the
// forward); `report` after each batch. With `sink`, each batch's parts go to it instead of into
// the returned rows (which then hold only the row indices).
ShardRows run_batches(Model& model, SafeCapturer* cap, const std::vector<Window>& windows,
                      const ExtractOptions& o, int64_t context, ExtractProgress& progress,
                      const std::function<void()>& report, const BatchSink* sink = nullptr) {
  const std::vector<size_t> order = batch_order(windows);
  ShardRows out;
  for (size_t begin = 0; begin < order.size(); begin += o.batch_size) {
    const size_t end = std::min(order.size(), begin + static_cast<size_t>(o.batch_size));
    std::vector<std::vector<int64_t>> seqs, positions;
    for (size_t k = begin; k < end; ++k) {
      seqs.push_back(windows[order[k]].ids);
      positions.push_back(windows[order[k]].positions);
    }
    Batch batch = Batch::from_sequences(seqs, model.config().vocab_size, context);
    StageTimer forward_timer("batch.forward");
    if (!cap) {
      model.forward(batch, Model::Logits::kSkipIfUnhooked);  // as the capture runs
    } else {
      cap->run(batch, positions, Model::Logits::kSkipIfUnhooked);
      forward_timer.stop();
      StageTimer parts_timer("batch.verified_parts");
      for (size_t r = 0; r < cap->row_seq().size(); ++r) {
        const Window& w = windows[order[begin + cap->row_seq()[r]]];
        out.row_line.push_back(w.doc_line);
        out.row_pos.push_back(w.start + cap->row_pos()[r]);
        out.row_token.push_back(cap->row_token()[r]);
      }
      if (sink) {
        std::vector<Part> parts;
        for (const PointInfo& p : cap->plan())
          parts.push_back(verified_part(*cap, p.name, o.capture.fingerprint));
        const int64_t rows = static_cast<int64_t>(cap->row_seq().size());
        cap->clear();
        (*sink)(std::move(parts), rows);
      } else {
        for (const PointInfo& p : cap->plan())
          out.parts[p.name].push_back(verified_part(*cap, p.name, o.capture.fingerprint));
        cap->clear();
      }
    }
    progress.tokens_done += batch.tokens();
    report();
  }
  return out;
}

}  // namespace

ExtractResult run_extract(Model& model, const Tokenizer* tokenizer, const ExtractOptions& o,
                          const std::function<void(const ExtractProgress&)>& on_progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t context = model.config().max_positions();
  const int64_t max_len = checked_max_length(o, context);
  FaultPoints faults(o.faults);
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw InputError(concat("rank ", o.rank, " is outside a world of ", o.world_size),
                     {"rank", "world_size"});
  const OutputLayout layout{o.rank, o.world_size};

  CorpusReader reader(o.input, tokenizer, model.config().vocab_size, o.skip_bad_lines);
  LineRange lines;
  std::optional<CorpusShare> share;
  int64_t total_docs = 0;
  if (layout.ranked()) {
    share = corpus_share(o.input, tokenizer, model.config().vocab_size, o.skip_bad_lines, o.rank,
                         o.world_size);
    if (share->total_documents == 0)
      throw InputError(concat("input ", o.input, " holds no documents"), {"input"});
    lines = {share->begin, share->end};
    total_docs = share->documents;
  } else {
    total_docs = CorpusReader::count_documents(o.input);
    if (total_docs == 0)
      throw InputError(concat("input ", o.input, " holds no documents"), {"input"});
  }

  std::unique_ptr<SafeCapturer> cap;
  CaptureOptions copts = o.capture;
  if (copts.attention_keys <= 0) copts.attention_keys = max_len;  // patterns: a window's keys
  if (!o.forward_only) cap = std::make_unique<SafeCapturer>(model, copts);
  if (o.stats_only && !o.stats)
    throw InputError("statistics only needs statistics", {"stats", "stats_only"});
  if (o.stats) {
    if (o.forward_only)
      throw InputError("statistics need the captures; drop forward-only",
                       {"stats", "forward_only"});
    if (o.stats_top_k < 0)
      throw InputError(concat("the statistics' top-k must be 0 or more, got ", o.stats_top_k),
                       {"stats_top_k"});
    for (const PointInfo& p : cap->plan())
      if (!at::isFloatingType(p.dtype))
        throw InputError(concat("statistics need floating-point points; '", p.name, "' holds ",
                                c10::toString(p.dtype),
                                " values (token ids or positions): leave it out of the capture"),
                         {"capture", "stats"});
  }
  std::set<int64_t> skip_tokens;
  if (o.skip_special) {
    if (tokenizer)
      for (int64_t id : tokenizer->special_ids()) skip_tokens.insert(id);
    for (int64_t id : {model.config().bos_token_id, model.config().eos_token_id})
      if (id >= 0) skip_tokens.insert(id);
  }
  const int64_t bytes_per_row = cap ? std::max<int64_t>(1, cap->bytes_per_token()) : 1;
  const RunIdentity id = run_identity(model, cap.get(), o, max_len, share ? &*share : nullptr);

  ExtractResult result;
  if (share) {
    result.lines_begin = share->begin;
    result.lines_end = share->end;
  }
  StartPoint start;
  std::unique_ptr<ShardWriter> writer;
  if (!o.forward_only) {
    if (o.resume) check_world_size(o.out, layout);
    std::error_code ec;
    // A rank killed before it wrote its manifest claimed nothing: resuming it starts it.
    const bool fresh_rank =
        o.resume && layout.ranked() && !fs::exists(fs::path(o.out) / layout.manifest(), ec);
    if (o.resume && !fresh_rank) {
      start = resume_run(o, model, id, layout, faults);
    } else {
      ExtractOptions first = o;
      if (fresh_rank) first.overwrite = false;
      start = start_run(first, id, layout, faults);
    }
    if (o.resume) result.resumed_from_line = start.resume_after + 1;
    writer = open_writer(o, start.manifest, std::move(start.claimed), layout, faults);
  }

  ExtractProgress progress;
  progress.documents_total = total_docs;
  auto report = [&] {
    progress.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (writer) {
      progress.bytes_written = writer->bytes_written();
      progress.shards_written = writer->shards_written();
    }
    if (on_progress) on_progress(progress);
  };

  Document doc;
  bool more = true;
  int64_t next_shard = start.next_shard;
  if (lines.begin > 0) reader.skip_to(lines.begin);
  while (more) {
    StageTimer gather_timer("shard.gather");
    ShardInput in = gather_shard(reader, doc, more, o, max_len, bytes_per_row, start.resume_after,
                                 lines, skip_tokens, progress);
    gather_timer.stop();
    if (in.windows.empty()) break;
    const int64_t streamed_rows = cap && !o.stats && !cap->plan().empty() && streaming_allowed()
                                      ? rows_in_order(in.windows)
                                      : -1;
    if (streamed_rows > 0) {
      // Written as the batches complete: the rows are already in order.
      const int64_t index = next_shard++;
      ShardJob begin;
      begin.kind = ShardJob::Kind::kBegin;
      begin.index = index;
      begin.rows = streamed_rows;
      begin.plan = cap->plan();
      writer->push(std::move(begin));
      const BatchSink sink = [&](std::vector<Part>&& parts, int64_t rows) {
        ShardJob job;
        job.kind = ShardJob::Kind::kBatch;
        job.index = index;
        job.rows = rows;
        for (Part& part : parts) {
          at::Tensor r = part.rows;
          if (!r.device().is_cpu()) r = r.cpu();
          r = r.contiguous();
          job.bytes += static_cast<size_t>(r.numel()) * r.element_size();
          job.parts.push_back({std::move(r), part.xxh3});
        }
        StageTimer push_timer("batch.push_wait");
        writer->push(std::move(job));
      };
      StageTimer batches_timer("shard.run_batches");
      ShardRows rows =
          run_batches(model, cap.get(), in.windows, o, context, progress, report, &sink);
      batches_timer.stop();
      progress.documents_done += in.documents;
      ShardJob end;
      end.kind = ShardJob::Kind::kEnd;
      end.index = index;
      end.first_line = in.first_line;
      end.last_line = in.last_line;
      end.documents = in.documents;
      end.row_line = std::move(rows.row_line);
      end.row_pos = std::move(rows.row_pos);
      end.row_token = std::move(rows.row_token);
      writer->push(std::move(end));
      report();
      continue;
    }
    StageTimer batches_timer("shard.run_batches");
    ShardRows rows = run_batches(model, cap.get(), in.windows, o, context, progress, report);
    batches_timer.stop();
    progress.documents_done += in.documents;
    if (cap) {
      ShardJob job;
      job.index = next_shard++;
      StageTimer assemble_timer("shard.assemble");
      job.contents = assemble_shard(job.index, cap->plan(), rows.parts, rows.row_line, rows.row_pos,
                                    rows.row_token, o.faults, layout.shard(job.index));
      job.first_line = in.first_line;
      job.last_line = in.last_line;
      job.documents = in.documents;
      assemble_timer.stop();
      StageTimer push_timer("shard.push_wait");
      writer->push(std::move(job));
    }
    report();
  }
  result.skipped_lines = reader.skipped();
  if (writer) {
    StageTimer finish_timer("run.finish_writer");
    writer->finish();
    finish_timer.stop();
    StageTimer complete_timer("run.complete");
    progress.bytes_written = writer->bytes_written();
    progress.shards_written = writer->shards_written();
    result.rank_manifest_checksum = writer->complete(
        {{"documents", progress.documents_done}, {"skipped_lines", result.skipped_lines}});
    result.manifest = (fs::path(o.out) / layout.manifest()).string();
    if (layout.ranked() && o.assemble) {
      // The last rank to finish finds every rank complete and assembles manifest.json; two
      // finishing together both write the same files, each atomically. Its own world size: rank 0
      // may not yet have removed an earlier run's rank files (--overwrite).
      result.assembled = merge_ranks(o.out, {}, layout.world_size, o.faults).assembled;
      if (result.assembled) result.manifest = (fs::path(o.out) / kManifestName).string();
    }
  }
  report();
  result.progress = progress;
  return result;
}

}  // namespace actcap
