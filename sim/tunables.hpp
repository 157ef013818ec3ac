// Calibration constants of the discrete-event simulator that are not properties of a cluster
// file. Each one can be overridden per run (SimOptions); the defaults cite their source.
#pragma once

namespace stratagem::sim {

// Slowdown of compute kernels while a communication kernel of the same GPU is moving data.
// NCCL kernels occupy SMs (one thread block per channel) and compete for HBM and L2 with the
// kernels they overlap. Published measurements put the slowdown at roughly 1.1x-1.3x:
//  - Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
//    Deep Learning: Performance and Power Implications", arXiv:2507.03114 (2025), abstract:
//    GPT and LLaMA training on 4x A100, H100, MI250 and MI210: overlapped compute is 18.9%
//    slower on average (40% at most) than the same compute without communication;
//  - worst cases are wave-quantization tails: a GEMM sized to exactly one wave on H100 runs
//    ~1.7x longer next to a 24-block ncclAllGather (NVIDIA developer forum, "Compute-
//    Communication Overlap Causes Severe GEMM Performance Degradation because of Tail Effect").
// 1.15 is a typical value in that range; calibrate per system with --interference. It applies
// only while a collective or a send of the same rank is in its data-movement phase (PCIe
// copies run on copy engines and do not count).
inline constexpr double kComputeCommInterference = 1.15;

// Fixed-point scales of the integer fluid model (see sim/README.md): a transfer at the full
// speed of its link makes kRateScale units of progress per nanosecond; compute likewise.
inline constexpr long long kRateScale = 1LL << 16;

}  // namespace stratagem::sim
