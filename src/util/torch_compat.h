// Differences between the LibTorch versions actcap builds against (Debian's CPU LibTorch 1.13, the
// libtorch inside pip's torch 2.x with CUDA), behind one small header.
#pragma once

#include <c10/core/Event.h>

#include <chrono>
#include <thread>

namespace actcap {

// Blocks the host until `event` completed. c10::Event::synchronize() exists only from LibTorch 2.4
// (1.13 lacks it); query() exists in both, so wait on it, yielding first and then sleeping briefly.
inline void synchronize_event(const c10::Event& event) {
  for (int spins = 0; !event.query(); ++spins) {
    if (spins < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace actcap
