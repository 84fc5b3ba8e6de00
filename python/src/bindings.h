// actcap._core: the compiled half of the Python package. Each file binds one concern; the Python
// layer (python/actcap/) gives them their documented, typed API.
#pragma once

// torch's own pybind11 casters: at::Tensor <-> torch.Tensor without copying.
#include <torch/csrc/utils/pybind.h>

namespace actcap::python {

namespace py = pybind11;

void bind_errors(py::module_& m);   // errors.cpp: InputError, RunError
void bind_capture(py::module_& m);  // capture.cpp: RowSelection, SnapshotStore, reference counts
void bind_engine(py::module_& m);  // engine.cpp: Engine (load, points, plan, run, compare, extract)
void bind_data(py::module_& m);    // data.cpp: verify, checksums, init-model

}  // namespace actcap::python
