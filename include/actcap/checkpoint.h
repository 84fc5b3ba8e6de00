// A Hugging Face checkpoint directory: config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json. Pickle checkpoints (pytorch_model.bin, *.pt, *.pth) are refused.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actcap/safetensors.h"

namespace actcap {

class Checkpoint {
 public:
  // Throws InputError: missing directory or config.json, pickle-only checkpoint (with the advice to
  // convert to safetensors), malformed index (weight_map not an object of strings, shard missing,
  // shard path escaping the directory, tensor listed in the index but absent from its shard),
  // the same tensor in two shards.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::string& config_path() const { return config_path_; }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  const TensorInfo& info(const std::string& name) const;
  // See SafetensorsFile::tensor. Throws InputError naming the tensor and the checkpoint.
  at::Tensor tensor(const std::string& name, size_t alignment = 1) const;
  // Paths of the safetensors files, in order.
  std::vector<std::string> files() const;
  // XXH3-64 over every tensor's name, dtype, shape and bytes in name order, as 16 hex digits:
  // identifies the weights regardless of how they are sharded.
  std::string fingerprint() const;

 private:
  std::string dir_;
  std::string config_path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

}  // namespace actcap
