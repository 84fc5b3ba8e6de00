// Output folders from Python: verify one, checksum a tensor as the manifest does, parse sizes.
#include <ATen/ATen.h>

#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>

#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/extract.h"
#include "actcap/hash.h"
#include "actcap/hooks.h"
#include "bindings.h"
#include "convert.h"
#include "export/manifest.h"

namespace actcap::python {

namespace {

// 16 lowercase hex digits (what hex64 writes): the value; anything else is kept as text.
bool parse_hex64(const std::string& s, uint64_t& v) {
  if (s.size() != 16) return false;
  v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return true;
}

// A checksum as the index keeps it: 0 absent, 1 a value, 2 text that is no hex64 (kept aside).
enum : uint8_t { kAbsent = 0, kValue = 1, kText = 2 };

// The manifest at `path` for actcap.Dataset, read as a stream (manifest.h) and kept compactly:
// the outline (everything but the shard list) as a dict, and per shard its file, rows, header
// checksum and tensor checksums in tensors (8 bytes a checksum, not a Python string each).
py::dict manifest_index(const std::string& path) {
  std::vector<std::string> files;
  std::vector<int64_t> rows;
  std::vector<uint64_t> header;
  std::vector<uint8_t> header_state;
  std::vector<std::string> names;
  std::unordered_map<std::string, int64_t> column;
  // (shard, column, value, state) of every checksum, made dense once the names are known
  struct Sum {
    int64_t shard, col;
    uint64_t value;
    uint8_t state;
  };
  std::vector<Sum> sums;
  std::map<std::pair<int64_t, int64_t>, std::string> texts;
  std::map<int64_t, std::string> header_texts;
  nlohmann::json outline;
  {
    py::gil_scoped_release release;
    std::string problem;
    std::optional<nlohmann::json> o = manifest_outline(path, problem);
    if (!o) throw InputError(concat(path, ": not a readable JSON manifest (", problem, ")"));
    outline = std::move(*o);
    if (outline.is_object()) {
      auto it = outline.find("shards");
      // (an object or value there has its members dropped by the outline's reader: say so)
      if (it != outline.end() && !it->is_array())
        throw InputError(concat(path, ": 'shards' is not a list"));
      if (it != outline.end()) {
        try {
          stream_manifest_entries(path, outline, [&](const nlohmann::json& e) {
            const int64_t i = static_cast<int64_t>(files.size());
            if (!e.is_object())
              throw InputError(concat(path, ": shard entry ", i, " is not a JSON object"));
            auto field = [&](const char* k) -> const nlohmann::json* {
              auto f = e.find(k);
              return f == e.end() ? nullptr : &*f;
            };
            const nlohmann::json* file = field("file");
            if (!file || !file->is_string() || file->get_ref<const std::string&>().empty())
              throw InputError(concat(path, ": shard entry ", i, " names no file"));
            files.push_back(file->get<std::string>());
            const nlohmann::json* r = field("rows");
            rows.push_back(r && r->is_number_integer() ? r->get<int64_t>() : 0);
            const nlohmann::json* h = field("header_xxh3");
            uint64_t v = 0;
            if (h && h->is_string() && parse_hex64(h->get_ref<const std::string&>(), v)) {
              header.push_back(v);
              header_state.push_back(kValue);
            } else {
              header.push_back(0);
              header_state.push_back(h ? kText : kAbsent);
              if (h) header_texts[i] = h->is_string() ? h->get<std::string>() : h->dump();
            }
            const nlohmann::json* c = field("checksums");
            if (c && c->is_object())
              for (auto it = c->begin(); it != c->end(); ++it) {
                auto [col, added] = column.emplace(it.key(), static_cast<int64_t>(names.size()));
                if (added) names.push_back(it.key());
                uint64_t value = 0;
                const bool hex = it->is_string() && parse_hex64(it->get_ref<const std::string&>(), value);
                sums.push_back({i, col->second, value, hex ? kValue : kText});
                if (!hex)
                  texts[{i, col->second}] = it->is_string() ? it->get<std::string>() : it->dump();
              }
          });
        } catch (const nlohmann::json::exception& e) {
          throw InputError(concat(path, ": not a readable JSON manifest (", e.what(), ")"));
        }
      }
    }
  }
  const int64_t n = static_cast<int64_t>(files.size());
  const int64_t k = static_cast<int64_t>(names.size());
  at::Tensor values = at::zeros({n, k}, at::kLong);
  at::Tensor state = at::zeros({n, k}, at::kByte);
  int64_t* vp = values.data_ptr<int64_t>();
  uint8_t* sp = state.data_ptr<uint8_t>();
  for (const Sum& s : sums) {
    vp[s.shard * k + s.col] = static_cast<int64_t>(s.value);
    sp[s.shard * k + s.col] = s.state;
  }
  auto to_tensor = [](const auto& v, at::ScalarType t) {
    at::Tensor out = at::empty({static_cast<int64_t>(v.size())}, t);
    if (!v.empty()) std::memcpy(out.data_ptr(), v.data(), v.size() * sizeof(v[0]));
    return out;
  };
  py::dict text_sums;
  for (const auto& [key, text] : texts)
    text_sums[py::make_tuple(key.first, names[static_cast<size_t>(key.second)])] = text;
  py::dict text_headers;
  for (const auto& [i, text] : header_texts) text_headers[py::int_(i)] = text;
  py::list file_list;
  for (const std::string& f : files) file_list.append(f);
  return py::dict(py::arg("outline") = py::module_::import("json").attr("loads")(outline.dump()),
                  py::arg("files") = file_list, py::arg("rows") = to_tensor(rows, at::kLong),
                  py::arg("header") = to_tensor(header, at::kLong),
                  py::arg("header_state") = to_tensor(header_state, at::kByte),
                  py::arg("header_text") = text_headers, py::arg("names") = names,
                  py::arg("checksums") = values, py::arg("checksum_state") = state,
                  py::arg("checksum_text") = text_sums);
}

}  // namespace

c10::Device parse_torch_device(const std::string& text) {
  try {
    return c10::Device(text);
  } catch (const c10::Error&) {
    throw InputError(concat("device '", text, "' is not a torch device (cpu, cuda, cuda:1, ...)"),
                     {"device"});
  }
}

void bind_data(py::module_& m) {
  m.def(
      "verify",
      [](const std::string& dir) {
        VerifyReport r;
        {
          py::gil_scoped_release release;
          r = verify_output(dir);
        }
        py::list issues;
        for (const VerifyIssue& i : r.issues)
          issues.append(py::make_tuple(i.file, i.tensor, i.problem));
        return py::dict(py::arg("ok") = r.ok(), py::arg("shards") = r.shards,
                        py::arg("tensors") = r.tensors, py::arg("bytes") = r.bytes,
                        py::arg("issues") = issues);
      },
      py::arg("dir"));
  m.def(
      "merge",
      [](const std::string& dir) {
        MergeReport r;
        {
          py::gil_scoped_release release;
          r = merge_ranks(dir);
        }
        if (!r.assembled) {
          std::string why;
          for (const std::string& w : r.waiting) why += (why.empty() ? "" : "; ") + w;
          throw RunError(concat("cannot assemble ", dir, "/manifest.json: ", why));
        }
        return py::dict(py::arg("manifest") = r.manifest, py::arg("world_size") = r.world_size,
                        py::arg("shards") = r.shards, py::arg("rows") = r.rows);
      },
      py::arg("dir"));
  // XXH3-64 of a tensor's bytes in row-major order, as the manifest's checksums (16 hex digits).
  m.def(
      "xxh3", [](const at::Tensor& t) { return hex64(tensor_xxh3(t)); }, py::arg("tensor"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "xxh3_bytes",
      [](py::bytes b) {
        const std::string s = b;
        return hex64(xxh3(s.data(), s.size()));
      },
      py::arg("data"));
  m.def("parse_bytes", &parse_bytes, py::arg("text"));
  m.def("manifest_index", &manifest_index, py::arg("path"));
  // Hook-point patterns (hooks.h): `*` one dot-separated segment, `**` any number, NAME:input.
  m.def("match_point", &match_point, py::arg("pattern"), py::arg("name"));
  m.def("nearest_points", &nearest_points, py::arg("pattern"), py::arg("names"), py::arg("n") = 5);
  m.def(
      "check_device", [](const std::string& d) { return parse_torch_device(d).str(); },
      py::arg("device"));
}

}  // namespace actcap::python
