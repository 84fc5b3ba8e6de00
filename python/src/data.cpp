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

// The manifest at `path` for actcap.Dataset, read in one streaming pass (manifest.h) and kept
// compactly: the outline (everything but the shard list) as a dict; the shards' file names as one
// UTF-8 blob with offsets; rows, header checksums and tensor checksums (one column per tensor
// name, [names, shards]) in tensors, 8 bytes a checksum rather than a Python string.
py::dict manifest_index(const std::string& path) {
  std::string names_blob;
  std::vector<int64_t> name_end, rows;
  std::vector<uint64_t> header;
  std::vector<uint8_t> header_state;
  std::vector<std::string> names;
  std::unordered_map<std::string, size_t> column;
  std::vector<std::vector<uint64_t>> values;  // per column, as long as its last shard
  std::vector<std::vector<uint8_t>> states;
  std::map<std::pair<int64_t, size_t>, std::string> texts;
  std::map<int64_t, std::string> header_texts;
  std::string problem;  // the first entry that is no shard entry
  nlohmann::json outline;
  int64_t n = 0;
  {
    py::gil_scoped_release release;
    std::string unreadable;
    std::optional<nlohmann::json> o =
        manifest_outline(path, unreadable, [&](const nlohmann::json& e) {
          const int64_t i = n++;
          if (!problem.empty()) return;
          if (!e.is_object()) {
            problem = concat("shard entry ", i, " is not a JSON object");
            return;
          }
          auto field = [&](const char* k) -> const nlohmann::json* {
            auto f = e.find(k);
            return f == e.end() ? nullptr : &*f;
          };
          const nlohmann::json* file = field("file");
          if (!file || !file->is_string() || file->get_ref<const std::string&>().empty()) {
            problem = concat("shard entry ", i, " names no file");
            return;
          }
          names_blob += file->get_ref<const std::string&>();
          name_end.push_back(static_cast<int64_t>(names_blob.size()));
          const nlohmann::json* r = field("rows");
          if (r && !(r->is_number_unsigned() && r->get<uint64_t>() <= (uint64_t{1} << 62))) {
            problem = concat("shard entry ", i, "'s rows is not a count (", r->dump(), ")");
            return;
          }
          rows.push_back(r ? r->get<int64_t>() : 0);
          const nlohmann::json* h = field("header_xxh3");
          uint64_t v = 0;
          const bool hex = h && h->is_string() && parse_hex64(h->get_ref<const std::string&>(), v);
          header.push_back(v);
          header_state.push_back(hex ? kValue : h ? kText : kAbsent);
          if (h && !hex) header_texts[i] = h->is_string() ? h->get<std::string>() : h->dump();
          const nlohmann::json* c = field("checksums");
          if (!c || !c->is_object()) return;
          for (auto it = c->begin(); it != c->end(); ++it) {
            auto [col, added] = column.emplace(it.key(), names.size());
            if (added) {
              names.push_back(it.key());
              values.emplace_back();
              states.emplace_back();
            }
            const size_t k = col->second;
            values[k].resize(static_cast<size_t>(i) + 1, 0);
            states[k].resize(static_cast<size_t>(i) + 1, kAbsent);
            uint64_t value = 0;
            const bool ok = it->is_string() && parse_hex64(it->get_ref<const std::string&>(), value);
            values[k][static_cast<size_t>(i)] = value;
            states[k][static_cast<size_t>(i)] = ok ? kValue : kText;
            if (!ok) texts[{i, k}] = it->is_string() ? it->get<std::string>() : it->dump();
          }
        });
    if (!o) throw InputError(concat(path, ": not a readable JSON manifest (", unreadable, ")"));
    outline = std::move(*o);
    // (an object or a value there had its members handed over as entries: say what it is)
    if (outline.is_object() && outline.contains("shards") && !outline["shards"].is_array())
      throw InputError(concat(path, ": 'shards' is not a list"));
    if (!problem.empty()) throw InputError(concat(path, ": ", problem));
  }
  const int64_t k = static_cast<int64_t>(names.size());
  // Column by column, each freed once copied: the index never exists twice.
  at::Tensor sums = at::empty({k, n}, at::kLong);
  at::Tensor sum_state = at::empty({k, n}, at::kByte);
  for (int64_t c = 0; c < k; ++c) {
    values[c].resize(static_cast<size_t>(n), 0);
    states[c].resize(static_cast<size_t>(n), kAbsent);
    std::memcpy(sums[c].data_ptr(), values[c].data(), static_cast<size_t>(n) * sizeof(uint64_t));
    std::memcpy(sum_state[c].data_ptr(), states[c].data(), static_cast<size_t>(n));
    std::vector<uint64_t>().swap(values[c]);
    std::vector<uint8_t>().swap(states[c]);
  }
  auto to_tensor = [](const auto& v, at::ScalarType t) {
    at::Tensor out = at::empty({static_cast<int64_t>(v.size())}, t);
    if (!v.empty()) std::memcpy(out.data_ptr(), v.data(), v.size() * sizeof(v[0]));
    return out;
  };
  py::dict text_sums;
  for (const auto& [key, text] : texts) text_sums[py::make_tuple(key.first, names[key.second])] = text;
  py::dict text_headers;
  for (const auto& [i, text] : header_texts) text_headers[py::int_(i)] = text;
  return py::dict(py::arg("outline") = py::module_::import("json").attr("loads")(outline.dump()),
                  py::arg("file_names") = py::bytes(names_blob),
                  py::arg("file_ends") = to_tensor(name_end, at::kLong),
                  py::arg("rows") = to_tensor(rows, at::kLong),
                  py::arg("header") = to_tensor(header, at::kLong),
                  py::arg("header_state") = to_tensor(header_state, at::kByte),
                  py::arg("header_text") = text_headers, py::arg("names") = names,
                  py::arg("checksums") = sums, py::arg("checksum_state") = sum_state,
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
