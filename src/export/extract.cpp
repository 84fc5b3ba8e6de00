#include "actcap/extract.h"

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
#include "actcap/safetensors.h"
#include "export/corpus.h"
#include "export/journal.h"
#include "export/shard.h"
#include "io/atomic_file.h"
#include "io/text_file.h"

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

// A shard ready for the writer: tensors in write order plus what the manifest records.
struct ShardJob {
  int64_t index = 0;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t rows = 0, first_line = 0, last_line = 0, documents = 0;
};

// Writes shards on its own thread behind a bounded queue, claiming each in the journal once it
// reads back intact; the manifest takes them all in when the run completes.
class ShardWriter {
 public:
  ShardWriter(std::string dir, json manifest, size_t capacity)
      : dir_(std::move(dir)),
        manifest_(std::move(manifest)),
        capacity_(capacity),
        journal_(dir_),
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
    space_.wait(lock, [&] { return queue_.size() < capacity_ || error_; });
    if (error_) std::rethrow_exception(error_);
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

  // Marks the run complete (after finish()).
  void complete(const json& extra) {
    for (const auto& [k, v] : extra.items()) manifest_[k] = v;
    manifest_["complete"] = true;
    write_file_atomic((fs::path(dir_) / kManifestName).string(), seal_manifest(manifest_));
    journal_.remove();
  }

  uint64_t bytes_written() const { return bytes_.load(); }
  int64_t shards_written() const { return shards_.load(); }
  const json& manifest() const { return manifest_; }

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
        space_.notify_one();
      }
      try {
        write(job);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
        queue_.clear();
        space_.notify_all();
        return;
      }
    }
  }

  void write(const ShardJob& job) {
    const WrittenShard shard = write_checked_shard(
        dir_, job.index, job.tensors, manifest_["model"]["fingerprint"].get<std::string>());
    const json entry = {{"file", shard.file},          {"rows", job.rows},
                        {"bytes", shard.bytes},        {"first_line", job.first_line},
                        {"last_line", job.last_line},  {"documents", job.documents},
                        {"checksums", shard.checksums}};
    journal_.append(entry);  // claimed from here on
    manifest_["shards"].push_back(entry);
    manifest_["rows"] = manifest_.value("rows", 0) + job.rows;
    bytes_ += shard.bytes;
    ++shards_;
  }

  std::string dir_;
  json manifest_;
  size_t capacity_;
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

json read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw InputError(concat("--resume: ", dir, " has no manifest.json to resume from"));
  json m;
  try {
    m = json::parse(read_text_file(path, kMaxManifestBytes, "manifest"));
  } catch (const json::exception& e) {
    throw InputError(
        concat("--resume: ", dir, "/manifest.json is not valid JSON (", e.what(), ")"));
  }
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
    throw InputError(concat("--resume: ", path, " is not an actcap extract manifest (", wrong,
                            "); use --overwrite to start again"));
  return m;
}

}  // namespace

ExtractResult run_extract(Model& model, const Tokenizer* tokenizer, const ExtractOptions& o,
                          const std::function<void(const ExtractProgress&)>& on_progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t context = model.config().max_positions();
  const int64_t max_len = o.max_length > 0 ? o.max_length : context;
  if (max_len > context)
    throw InputError(concat("--max-length ", max_len, " exceeds the model's context of ", context));
  if (o.stride < 0 || o.stride > max_len)
    throw InputError(
        concat("--stride ", o.stride, " must be between 1 and --max-length (", max_len, ")"));
  if (o.batch_size <= 0) throw InputError("--batch-size must be positive");
  if (o.resume && o.overwrite) throw InputError("--resume and --overwrite exclude each other");

  CorpusReader reader(o.input, tokenizer, model.config().vocab_size(), o.skip_bad_lines);
  const int64_t total_docs = CorpusReader::count_documents(o.input);
  if (total_docs == 0) throw InputError(concat("--input ", o.input, " holds no documents"));

  std::unique_ptr<SafeCapturer> cap;
  if (!o.forward_only) cap = std::make_unique<SafeCapturer>(model, o.capture);
  const int64_t bytes_per_row = cap ? std::max<int64_t>(1, cap->bytes_per_token()) : 1;

  // What a resumed run must agree on to produce the same files.
  const json head = manifest_head(model, cap ? cap->plan() : std::vector<PointInfo>{});
  const json& points = head["points"];
  json settings = {{"capture", o.capture.patterns}, {"batch_size", o.batch_size},
                   {"max_length", max_len},         {"stride", o.stride},
                   {"shard_bytes", o.shard_bytes},  {"skip_bad_lines", o.skip_bad_lines}};
  json input = {{"path", o.input}, {"xxh3", CorpusReader::fingerprint(o.input)}};

  ExtractResult result;
  json manifest;
  int64_t next_shard = 0, resume_after = -1;
  if (!o.forward_only) {
    if (o.resume) {
      manifest = read_manifest(o.out);
      for (const char* key : {"settings", "points", "input"}) {
        const json& want = std::string(key) == "settings" ? settings
                           : std::string(key) == "points" ? points
                                                          : input;
        if (manifest.value(key, json()) != want)
          throw InputError(concat("--resume: ", key, " differ from the run in ", o.out, " (",
                                  manifest.value(key, json()).dump(), " there, ", want.dump(),
                                  " now); use --overwrite to start again"));
      }
      if (manifest["model"].value("fingerprint", "") != model.fingerprint())
        throw InputError(concat("--resume: ", o.out,
                                " was written from other weights; use --overwrite to start again"));
      // Keep exactly the shards the manifest (and its journal) claims, after checking them all;
      // drop anything else.
      VerifyReport check = verify_output(o.out);
      for (const VerifyIssue& i : check.issues)
        if (i.problem.find("not marked complete") == std::string::npos)
          throw RunError(concat("--resume: ", o.out, "/", i.file,
                                (i.tensor.empty() ? "" : " " + i.tensor), ": ", i.problem));
      manifest["shards"] = check.claimed;
      std::set<std::string> claimed;
      int64_t rows = 0;
      for (const json& s : manifest["shards"]) {
        if (!s.contains("last_line") || !s["last_line"].is_number_integer() ||
            !s.contains("rows") || !s["rows"].is_number_integer())
          throw InputError(concat("--resume: shard entry ", s.value("file", "?"), " in ", o.out,
                                  " has no integer rows/last_line: not written by extract; use "
                                  "--overwrite to start again"));
        claimed.insert(s["file"].get<std::string>());
        resume_after = s["last_line"].get<int64_t>();
        rows += s["rows"].get<int64_t>();
        ++next_shard;
      }
      // The manifest takes in the journal's entries first; only then is the journal dropped,
      // with anything else of ours that is not claimed.
      manifest["complete"] = false;
      manifest["rows"] = rows;
      write_file_atomic((fs::path(o.out) / kManifestName).string(), seal_manifest(manifest));
      for (const auto& e : fs::directory_iterator(o.out)) {
        const std::string n = e.path().filename().string();
        if (n != kManifestName && !claimed.count(n) && is_output_file(n)) fs::remove(e.path());
      }
      result.resumed_from_line = resume_after + 1;
    } else {
      prepare_output_dir(o.out, o.overwrite);
      manifest = head;
      manifest["settings"] = settings;
      manifest["input"] = input;
      write_file_atomic((fs::path(o.out) / kManifestName).string(), seal_manifest(manifest));
    }
  }
  std::unique_ptr<ShardWriter> writer;
  if (!o.forward_only)
    writer = std::make_unique<ShardWriter>(o.out, manifest, static_cast<size_t>(o.queue_shards));

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
  while (more) {
    // Gather one shard's worth of whole documents.
    std::vector<Window> windows;
    int64_t shard_bytes = 0, first_line = -1, last_line = -1, docs = 0;
    while (shard_bytes < static_cast<int64_t>(o.shard_bytes) && (more = reader.next(doc))) {
      if (doc.line <= resume_after) {
        ++progress.documents_done;
        continue;
      }
      const int64_t len = static_cast<int64_t>(doc.ids.size());
      if (len > max_len && o.stride == 0)
        throw InputError(concat(
            o.input, ":", doc.line + 1, ": document has ", len, " tokens, over --max-length ",
            max_len, "; pass --stride N to cut long documents into overlapping windows"));
      const std::vector<int64_t> keep = o.capture.positions.select(len);
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
        windows.push_back(std::move(w));
        if (end == len) break;
      }
      if (first_line < 0) first_line = doc.line;
      last_line = doc.line;
      ++docs;
    }
    if (windows.empty()) break;

    // Batches grouped by length (longest first), so padding stays small.
    std::vector<size_t> order(windows.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return windows[a].ids.size() > windows[b].ids.size();
    });
    std::map<std::string, std::vector<at::Tensor>> parts;
    std::vector<int64_t> row_line, row_pos;
    for (size_t begin = 0; begin < order.size(); begin += o.batch_size) {
      const size_t end = std::min(order.size(), begin + static_cast<size_t>(o.batch_size));
      std::vector<std::vector<int64_t>> seqs, positions;
      for (size_t k = begin; k < end; ++k) {
        seqs.push_back(windows[order[k]].ids);
        positions.push_back(windows[order[k]].positions);
      }
      Batch batch = Batch::from_sequences(seqs, model.config().vocab_size(), context);
      if (!cap) {
        model.forward(batch, Model::Logits::kSkipIfUnhooked);  // as the capture runs
      } else {
        cap->run(batch, positions, Model::Logits::kSkipIfUnhooked);
        for (size_t r = 0; r < cap->row_seq().size(); ++r) {
          const Window& w = windows[order[begin + cap->row_seq()[r]]];
          row_line.push_back(w.doc_line);
          row_pos.push_back(w.start + cap->row_pos()[r]);
        }
        for (const PointInfo& p : cap->plan())
          parts[p.name].push_back(cap->get(p.name));  // verified read
        cap->clear();
      }
      progress.tokens_done += batch.tokens();
      report();
    }
    progress.documents_done += docs;
    if (cap) {
      // Rows in (document line, position) order.
      std::vector<int64_t> perm(row_line.size());
      std::iota(perm.begin(), perm.end(), 0);
      std::sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
        return row_line[a] != row_line[b] ? row_line[a] < row_line[b] : row_pos[a] < row_pos[b];
      });
      const at::Tensor index = at::tensor(perm, at::kLong);
      ShardJob job;
      job.index = next_shard++;
      for (const PointInfo& p : cap->plan())
        job.tensors.emplace_back(p.name, at::cat(parts[p.name], 0).index_select(0, index));
      job.tensors.emplace_back("__rows__.seq",
                               at::tensor(row_line, at::kLong).index_select(0, index));
      job.tensors.emplace_back("__rows__.pos",
                               at::tensor(row_pos, at::kLong).index_select(0, index));
      job.rows = static_cast<int64_t>(perm.size());
      job.first_line = first_line;
      job.last_line = last_line;
      job.documents = docs;
      writer->push(std::move(job));
    }
    report();
  }
  result.skipped_lines = reader.skipped();
  if (writer) {
    writer->finish();
    progress.bytes_written = writer->bytes_written();
    progress.shards_written = writer->shards_written();
    writer->complete(
        {{"documents", progress.documents_done}, {"skipped_lines", result.skipped_lines}});
    result.manifest = (fs::path(o.out) / kManifestName).string();
  }
  report();
  result.progress = progress;
  return result;
}

}  // namespace actcap
