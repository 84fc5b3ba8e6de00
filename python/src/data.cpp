// Output folders from Python: verify one, checksum a tensor as the manifest does, parse sizes.
#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/extract.h"
#include "actcap/hash.h"
#include "actcap/hooks.h"
#include "bindings.h"
#include "convert.h"

namespace actcap::python {

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
  // Hook-point patterns (hooks.h): `*` one dot-separated segment, `**` any number, NAME:input.
  m.def("match_point", &match_point, py::arg("pattern"), py::arg("name"));
  m.def("nearest_points", &nearest_points, py::arg("pattern"), py::arg("names"), py::arg("n") = 5);
  m.def(
      "check_device", [](const std::string& d) { return parse_torch_device(d).str(); },
      py::arg("device"));
}

}  // namespace actcap::python
