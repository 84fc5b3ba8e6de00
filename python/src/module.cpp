#include "bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "actcap's C++ core (use the actcap package, not this module)";
  actcap::python::bind_errors(m);
  actcap::python::bind_capture(m);
  actcap::python::bind_engine(m);
  actcap::python::bind_data(m);
}
