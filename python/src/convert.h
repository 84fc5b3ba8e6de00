// Conversions the bindings share.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace actcap::python {

// A torch device string ("cpu", "cuda", "cuda:1") as a c10::Device; InputError otherwise.
c10::Device parse_torch_device(const std::string& text);

}  // namespace actcap::python
