// actcap::InputError -> actcap.InputError (a ValueError), actcap::RunError -> actcap.RunError (a
// RuntimeError), with the C++ message and the library's names of the settings that fix it.
#include "actcap/error.h"
#include "bindings.h"

namespace actcap::python {

namespace {

template <typename E>
void raise(PyObject* type, const E& e) {
  py::object err = py::reinterpret_borrow<py::object>(type)(e.what());
  err.attr("settings") = py::cast(e.settings());
  PyErr_SetObject(type, err.ptr());
}

}  // namespace

void bind_errors(py::module_& m) {
  static py::exception<InputError> input(m, "InputError", PyExc_ValueError);
  static py::exception<RunError> run(m, "RunError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      raise(input.ptr(), e);
    } catch (const RunError& e) {
      raise(run.ptr(), e);
    } catch (const c10::Error& e) {  // LibTorch's what() carries a C++ backtrace
      PyErr_SetString(run.ptr(), e.what_without_backtrace());
    }
  });
}

}  // namespace actcap::python
