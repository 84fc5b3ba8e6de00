// A 64-bit hash of a tensor's bytes computed with tensor operations on the device that holds it,
// queued on the current stream like any kernel (no host copy, no wait): the fingerprint of
// boundary transfers and of snapshots on accelerators, checked again on the host copy (where
// host_hash gives the same value in one pass over the bytes).
//
// The bytes, zero-padded to whole 8-byte words w_i, are summed as sum_i w_i * m_i (mod 2^64) with
// odd multipliers m_i = (i * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) | 1, plus the byte count
// times a constant. On the device the words are summed as rows of 2^16 against one table of
// multipliers per device (two reductions over the data; device_hash.cpp shows the identity), on
// the host in one pass (host_hash); the tests hold the two equal.
// Strength: a change confined to one 8-byte word is always detected (an odd multiplier is
// invertible mod 2^64); random damage over several words goes undetected with
// probability about 2^-64 per comparison (one in 2^(64 - k) when every difference is a multiple of
// 2^k, as flipping only high bits would give); it is linear and unkeyed, so it is no defence
// against data crafted to collide. XXH3 (actcap/hash.h) remains the fingerprint of everything on
// the host.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace actcap {

// 0-dim int64 tensor on `t`'s device (its bits are the hash); queued, not waited for. Tensor
// operations on any device, the CPU included.
at::Tensor device_hash(const at::Tensor& t);
// The same hash as an integer (waits for it). A host tensor is hashed in one pass over its bytes
// (host_hash below), not with device_hash()'s tensor operations: this is the check of every
// capture and transfer that left an accelerator, so it runs at memory speed on the host.
uint64_t device_hash_value(const at::Tensor& t);
// The same hash of a host tensor's bytes, in one pass (split over LibTorch's intra-op threads for
// large tensors), allocating nothing unless `t` is not contiguous.
uint64_t host_hash(const at::Tensor& t);

}  // namespace actcap
