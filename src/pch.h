// Precompiled header: LibTorch's ATen headers dominate compile time on a 2-core machine.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
