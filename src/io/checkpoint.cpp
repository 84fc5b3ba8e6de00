#include "actcap/checkpoint.h"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "actcap/error.h"
#include "actcap/hash.h"
#include "io/text_file.h"

namespace actcap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The error_code overloads: an unreadable path counts as absent rather than throwing
// filesystem_error past our InputError contract.
bool regular_file_exists(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// Index files are small, so they are read whole. Duplicate keys are rejected for the same reason
// as in safetensors headers: nlohmann would silently keep only the last mapping of a tensor.
json read_index(const fs::path& path) {
  const std::string text = read_text_file(path.string(), kMaxIndexBytes, "checkpoint index");

  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, callback);
  } catch (const json::exception& e) {
    throw InputError(concat(path.string(), " is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    throw InputError(concat(path.string(), ": key '", duplicate, "' appears more than once"));
  }
  return j;
}

// Shard names come from a file we do not control; they must not reach outside the checkpoint.
void check_shard_name(const std::string& file, const std::string& tensor, const fs::path& index) {
  const fs::path p(file);
  if (file.empty() || p.is_absolute() || p.has_root_name() || p.has_root_directory()) {
    throw InputError(concat(index.string(), ": weight_map entry for tensor '", tensor,
                            "' names file '", file,
                            "'; expected a file name relative to the checkpoint directory"));
  }
  for (const auto& part : p) {
    if (part == "..") {
      throw InputError(concat(index.string(), ": weight_map entry for tensor '", tensor,
                              "' names file '", file,
                              "', which leaves the checkpoint directory ('..' is not allowed)"));
    }
  }
}

// A pickle file found in `dir`, or empty when there is none.
std::string find_pickle(const fs::path& dir) {
  for (const char* name : {"pytorch_model.bin", "pytorch_model.bin.index.json"}) {
    if (path_exists(dir / name)) return name;
  }
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string ext = p.extension().string();
    if (ext == ".bin" || ext == ".pt" || ext == ".pth") found.push_back(p.filename().string());
  }
  if (found.empty()) return "";
  std::sort(found.begin(), found.end());
  return found.front();
}

void update(XXH3_state_t* state, const void* data, size_t size) {
  XXH3_64bits_update(state, data, size);
}

// Length-prefixed so that ("ab", "c") and ("a", "bc") hash differently.
void update_string(XXH3_state_t* state, const std::string& s) {
  const uint64_t n = s.size();
  update(state, &n, sizeof(n));
  update(state, s.data(), s.size());
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::exists(root, ec))
    throw InputError(concat("checkpoint directory ", dir, " does not exist"));
  if (!fs::is_directory(root, ec)) {
    throw InputError(concat("checkpoint path ", dir, " is not a directory"));
  }
  const fs::path config = root / "config.json";
  if (!regular_file_exists(config)) throw InputError(concat("no config.json in ", dir));

  Checkpoint ck;
  ck.dir_ = dir;
  ck.config_path_ = config.string();

  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";
  if (path_exists(index_path)) {
    const json index = read_index(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw InputError(concat(index_path.string(),
                              ": expected an object with a \"weight_map\" object ",
                              "mapping tensor names to safetensors files"));
    }
    const json& weight_map = index["weight_map"];
    std::map<std::string, std::string> tensor_file;
    std::set<std::string> shard_names;
    for (const auto& [tensor, file] : weight_map.items()) {
      if (!file.is_string()) {
        throw InputError(concat(index_path.string(), ": weight_map entry for tensor '", tensor,
                                "' must be a file name string, found ", file.type_name()));
      }
      const std::string name = file.get<std::string>();
      check_shard_name(name, tensor, index_path);
      tensor_file[tensor] = name;
      shard_names.insert(name);
    }

    std::map<std::string, size_t> shard_index;
    for (const std::string& name : shard_names) {
      const fs::path shard = root / name;
      if (!regular_file_exists(shard)) {
        throw InputError(concat(index_path.string(), " lists shard ", name, " but ", shard.string(),
                                " does not exist"));
      }
      shard_index[name] = ck.files_.size();
      ck.files_.push_back(SafetensorsFile::open(shard.string()));
    }
    for (const auto& [tensor, name] : tensor_file) {
      const auto& file = ck.files_[shard_index[name]];
      if (file->find(tensor) == nullptr) {
        throw InputError(concat(index_path.string(), " maps tensor '", tensor, "' to ", name,
                                ", but ", file->path(), " has no tensor '", tensor, "'"));
      }
    }
  } else if (path_exists(single_path)) {
    ck.files_.push_back(SafetensorsFile::open(single_path.string()));
  } else {
    const std::string pickle = find_pickle(root);
    if (!pickle.empty()) {
      throw InputError(
          concat(dir, " holds only a pickle checkpoint (", pickle,
                 "); actcap does not load pickle files. Convert it to safetensors, e.g. "
                 "in Python: model.save_pretrained(\"",
                 dir, "\", safe_serialization=True)"));
    }
    throw InputError(concat("no model.safetensors or model.safetensors.index.json in ", dir));
  }

  // Every tensor in every shard is reachable, listed in the index or not; a name in two shards
  // would make the weights depend on load order, so it is refused.
  for (size_t i = 0; i < ck.files_.size(); ++i) {
    for (const TensorInfo& t : ck.files_[i]->tensors()) {
      auto [it, inserted] = ck.where_.emplace(t.name, i);
      if (!inserted) {
        throw InputError(concat("tensor '", t.name, "' appears in both ",
                                ck.files_[it->second]->path(), " and ", ck.files_[i]->path()));
      }
    }
  }
  return ck;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw InputError(concat("checkpoint ", dir_, " has no tensor '", name, "'"));
  return *files_[it->second]->find(name);
}

at::Tensor Checkpoint::tensor(const std::string& name, size_t alignment) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw InputError(concat("checkpoint ", dir_, " has no tensor '", name, "'"));
  return files_[it->second]->tensor(name, alignment);
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  out.reserve(files_.size());
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

std::string Checkpoint::fingerprint() const {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) {
    throw RunError("cannot allocate an XXH3 hashing state");
  }
  XXH3_state_t* s = state.get();
  // where_ is a std::map, so this is name order, independent of sharding.
  for (const auto& [name, index] : where_) {
    const SafetensorsFile& file = *files_[index];
    const TensorInfo& t = *file.find(name);
    update_string(s, name);
    update_string(s, t.dtype_name);
    const uint64_t rank = t.shape.size();
    update(s, &rank, sizeof(rank));
    for (int64_t d : t.shape) update(s, &d, sizeof(d));
    const uint64_t nbytes = t.end - t.begin;
    update(s, &nbytes, sizeof(nbytes));
    if (nbytes > 0) update(s, file.data(t), nbytes);
  }
  return hex64(XXH3_64bits_digest(s));
}

}  // namespace actcap
