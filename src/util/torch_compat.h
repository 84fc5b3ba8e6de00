// Differences between the LibTorch versions actcap builds against (Debian's CPU LibTorch 1.13, the
// libtorch inside pip's torch 2.x with CUDA), behind one small header.
#pragma once

#include <c10/core/Event.h>

#include <chrono>
#include <thread>
#include <type_traits>
#include <utility>

namespace actcap {

namespace compat {
// Whether E has `synchronize() const` (c10::Event from LibTorch 2.x; 1.13 lacks it). Detected
// rather than read from a version number: no version header is reachable from c10's alone.
template <typename E, typename = void>
struct has_synchronize : std::false_type {};
template <typename E>
struct has_synchronize<E, std::void_t<decltype(std::declval<const E&>().synchronize())>>
    : std::true_type {};

template <typename E>
void synchronize_event(const E& event) {
  if constexpr (has_synchronize<E>::value) {
    event.synchronize();  // the backend's own wait (cudaEventSynchronize)
  } else {
    // query() exists in every version: wait on it, yielding first and then sleeping briefly.
    for (int spins = 0; !event.query(); ++spins) {
      if (spins < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}
}  // namespace compat

// Blocks the host until `event` completed.
inline void synchronize_event(const c10::Event& event) { compat::synchronize_event(event); }

}  // namespace actcap
