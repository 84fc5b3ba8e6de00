#include "executor/fault_delay.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace actcap {

namespace {

using SpinKernel = void (*)(int64_t cycles);

// `void at::cuda::sleep(int64_t cycles)` (ATen/cuda/Sleep.h, in libtorch_cuda): one thread spinning
// on clock64() on the current CUDA stream. Looked up in the library already loaded (a program
// linked against a CUDA LibTorch, or torch's Python module) rather than linked.
SpinKernel cuda_spin_kernel() {
  static const SpinKernel kernel = [] {
    const char* symbol = "_ZN2at4cuda5sleepEl";
    void* found = nullptr;
    if (void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD)) {
      found = dlsym(lib, symbol);
      dlclose(lib);  // only drops the reference RTLD_NOLOAD took; the library stays loaded
    }
    if (!found) found = dlsym(RTLD_DEFAULT, symbol);
    return reinterpret_cast<SpinKernel>(found);
  }();
  return kernel;
}

// SM clock cycles per millisecond, taken at 2 GHz (an H100/H200 boosts to about 1.98 GHz; a slower
// clock only lengthens the delay).
constexpr int64_t kCyclesPerMs = 2'000'000;

}  // namespace

bool fault_delay_on_device(c10::Device device) {
  return device.is_cpu() || (device.is_cuda() && cuda_spin_kernel() != nullptr);
}

void fault_delay(c10::Device device, int ms) {
  if (ms <= 0) return;
  if (device.is_cuda()) {
    if (const SpinKernel spin = cuda_spin_kernel()) {
      spin(kCyclesPerMs * ms);  // on the current stream: the queue's, under its StreamGuard
      return;
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace actcap
