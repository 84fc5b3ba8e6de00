// The careful part of actcap.SafeCapturer and actcap.audit: row selection, snapshots (copy on the
// producing device and stream, asynchronous pinned copy to the host, fence, fingerprint), verified
// reads, saving, and the reference counts the bare-reference check compares.
#include "actcap/capture.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/python_variable.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <type_traits>
#include <utility>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/snapshot.h"
#include "bindings.h"
#include "convert.h"

namespace actcap::python {

namespace {

at::Tensor int_tensor(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); }

// Whether a storage's Python wrapper exists and nothing but LibTorch holds it. LibTorch 2.x's
// PyObject preservation through the refcount (c10/util/intrusive_ptr.h: a wrapper is kept alive
// while other C++ references exist, and holds a use of its storage) has PyObjectSlot::
// has_unique_reference(); a LibTorch without it answers false. Detected, not read from a version.
template <typename S, typename = void>
struct reports_unique_wrapper : std::false_type {};
template <typename S>
struct reports_unique_wrapper<
    S, std::void_t<decltype(std::declval<const S&>().pyobj_slot()->has_unique_reference())>>
    : std::true_type {};

template <typename S>
bool storage_wrapper_held_only_by_libtorch(const S& storage) {
  if constexpr (reports_unique_wrapper<S>::value)
    return storage.pyobj_slot()->has_unique_reference();
  else
    return false;
}

// Writes through `write` into a sibling staging folder and moves the result into `dir` only once
// it is complete (shards first, manifest last): a save that fails (nothing captured, a point that
// did not fire once per forward) leaves `dir` as it was, even with overwrite.
std::vector<ExportedTensor> save_staged(
    const std::string& dir, bool overwrite,
    const std::function<std::vector<ExportedTensor>(const std::string&)>& write) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!overwrite)
    prepare_output_dir(dir, false);  // refuses a non-empty folder, touches nothing
  else if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(concat("output folder ", dir, " exists and is not a folder"), {"out"});
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  const fs::path staging = target.string() + ".partial-" + std::to_string(::getpid());
  fs::remove_all(staging, ec);
  prepare_output_dir(staging.string(), false);
  std::vector<ExportedTensor> out;
  try {
    out = write(staging.string());
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  prepare_output_dir(target.string(), true);  // the old manifest goes first, then its shards
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(staging)) files.push_back(entry.path());
  std::stable_partition(files.begin(), files.end(),
                        [](const fs::path& f) { return f.filename() != "manifest.json"; });
  for (const fs::path& f : files) {
    fs::rename(f, target / f.filename(), ec);
    if (ec)
      throw RunError(
          concat("cannot move ", f.string(), " into ", target.string(), ": ", ec.message()));
  }
  fs::remove_all(staging, ec);
  return out;
}

}  // namespace

void bind_capture(py::module_& m) {
  py::class_<RowSelection, std::shared_ptr<RowSelection>>(m, "RowSelection")
      .def_static(
          "from_mask",
          [](const at::Tensor& mask, const std::string& positions, std::optional<at::Tensor> ids,
             int64_t window) {
            return std::make_shared<RowSelection>(RowSelection::from_mask(
                mask, PositionSpec::parse(positions), ids ? *ids : at::Tensor(), window));
          },
          py::arg("attention_mask"), py::arg("positions") = "all", py::arg("ids") = py::none(),
          py::arg("window") = 0)
      .def_static(
          "dense",
          [](int64_t batch, int64_t seq, const std::string& positions,
             std::optional<at::Tensor> ids) {
            return std::make_shared<RowSelection>(RowSelection::dense(
                batch, seq, PositionSpec::parse(positions), ids ? *ids : at::Tensor()));
          },
          py::arg("batch"), py::arg("seq"), py::arg("positions") = "all",
          py::arg("ids") = py::none())
      .def_readonly("batch", &RowSelection::batch)
      .def_readonly("seq", &RowSelection::seq)
      .def_property_readonly("rows", &RowSelection::rows)
      .def_property_readonly("row_seq", [](const RowSelection& r) { return int_tensor(r.row_seq); })
      .def_property_readonly("row_pos", [](const RowSelection& r) { return int_tensor(r.row_pos); })
      .def_property_readonly("row_token",
                             [](const RowSelection& r) { return int_tensor(r.row_token); });

  py::class_<SnapshotStore>(m, "SnapshotStore")
      .def(py::init([](const std::string& device, const std::string& dtype,
                       std::optional<uint64_t> budget, bool fingerprint) {
             SnapshotStoreOptions o;
             o.stable_device = parse_torch_device(device);
             o.dtype = parse_capture_dtype(dtype);
             o.budget_bytes = budget;
             o.fingerprint = fingerprint;
             return std::make_unique<SnapshotStore>(o);
           }),
           py::arg("device") = "cpu", py::arg("dtype") = "keep", py::arg("budget") = py::none(),
           py::arg("fingerprint") = true)
      .def(
          "capture",
          [](SnapshotStore& s, const std::string& point, const at::Tensor& t,
             std::shared_ptr<RowSelection> rows,
             int64_t step) { return s.capture(point, t, std::move(rows), step); },
          py::arg("point"), py::arg("tensor"), py::arg("rows"), py::arg("step"))
      .def("fence", &SnapshotStore::fence)
      .def("get", &SnapshotStore::get, py::arg("point"), py::arg("call") = -1)
      .def("verify", &SnapshotStore::verify)
      .def("points", &SnapshotStore::points)
      .def("calls", &SnapshotStore::calls, py::arg("point"))
      .def_property_readonly("bytes", &SnapshotStore::bytes)
      .def_property_readonly("in_flight", &SnapshotStore::in_flight)
      .def("clear", &SnapshotStore::clear)
      .def("index",
           [](SnapshotStore& s) {
             // (point, call, step, rows selected or None) of every kept snapshot, in order.
             py::list out;
             const auto& snaps = s.snapshots();
             for (size_t i = 0; i < snaps.size(); ++i) {
               const auto& sel = s.selection(i);
               out.append(py::make_tuple(
                   snaps[i].point, snaps[i].call, snaps[i].step,
                   sel ? py::cast(std::const_pointer_cast<RowSelection>(sel)) : py::none()));
             }
             return out;
           })
      .def(
          "save",
          [](SnapshotStore& s, const std::string& dir, bool overwrite, const std::string& path,
             const std::string& model_type, const std::string& fingerprint,
             const std::map<std::string, std::string>& device_map,
             const std::vector<std::string>& points) {
            const auto exported = save_staged(dir, overwrite, [&](const std::string& staging) {
              return export_snapshots(
                  staging, s, CaptureOrigin{path, model_type, fingerprint, device_map}, points);
            });
            py::list out;
            for (const ExportedTensor& e : exported)
              out.append(py::dict(py::arg("name") = e.name, py::arg("shape") = e.shape,
                                  py::arg("dtype") = e.dtype, py::arg("xxh3") = e.checksum));
            return out;
          },
          py::arg("dir"), py::arg("overwrite"), py::arg("path"), py::arg("model_type"),
          py::arg("fingerprint"), py::arg("device_map"), py::arg("points"));

  // The bare-reference check of the engine's hooks (src/models/module.cpp), for a Python object:
  // its Python reference count (as seen inside this call: compared before and after a hook, never
  // read alone), and for a tensor the use counts of its TensorImpl and its storage, and whether the
  // storage has a Python wrapper that only LibTorch itself holds (audit.py decides, by measuring
  // once, whether such a wrapper holds one of the storage's uses). A hook that keeps the object, a
  // view or a detach() of it raises one of the counts.
  m.def("reference_counts", [](py::handle obj) -> py::tuple {
    const Py_ssize_t py_refs = Py_REFCNT(obj.ptr());
    if (!THPVariable_Check(obj.ptr())) return py::make_tuple(py_refs, 0, 0, false);
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    const size_t storage = t.has_storage() ? t.storage().use_count() : 0;
    const bool wrapper_kept_by_libtorch =
        t.has_storage() &&
        storage_wrapper_held_only_by_libtorch(*t.storage().unsafeGetStorageImpl());
    return py::make_tuple(py_refs, t.use_count(), storage, wrapper_kept_by_libtorch);
  });
}

}  // namespace actcap::python
