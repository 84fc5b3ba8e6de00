// The test-only delays of AsyncFaults (`delay:copy:MS`, `delay:stage:MS`): the work of a queue
// starts about MS ms late, so that a missing fence shows as wrong values.
//
// On a host queue (cpu, a virtual cpu:N worker) the thread sleeps. On an accelerator the work runs
// on the calling thread and only queues kernels, so sleeping there would delay nothing on the
// device: instead the device itself is kept busy on the queue's current stream (LibTorch's CUDA
// spin kernel, `at::cuda::sleep`, found at run time so that no CUDA header or library is needed to
// build), and that stream falls behind the others as a slow copy or kernel would.
#pragma once

#include <c10/core/Device.h>

namespace actcap {

// Delays what is queued next on `device`'s current stream (a host queue: this thread) by `ms`.
void fault_delay(c10::Device device, int ms);

// Whether fault_delay can delay `device`'s stream itself; false where only the host would sleep
// (an accelerator whose LibTorch has no spin kernel).
bool fault_delay_on_device(c10::Device device);

}  // namespace actcap
