// The GPU implementations on a case: the kernels' CPU model (gpu.model.<profile>, always) and the
// kernels themselves (gpu.absorbed.<profile>, gpu.explicit.<profile>, only where a device exists).
// Both read the same GpuCase, converted once from the case's bits. Outputs are unnamed: the
// harness registry names them.
#pragma once
#include <string>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "gpu/qkmla_gpu.hpp"

namespace qkmla::impl {

// Why the kernels cannot run this config ("" when they can): they implement fp32, bf16, fp16 and
// fp8 (not fp64), QK-normed (not norm none).
std::string gpu_not_applicable(const MlaConfig& c);
// The case's tensors as fp32 values of their bits (exact: every stored format fits in fp32).
// `cache_by_rows`: kv_c left empty and read through kv_c_rows from k, which must outlive the
// result (the CPU model's way: no whole fp32 copy of the cache).
gpu::GpuCase to_gpu_case(const Case& k, bool cache_by_rows = false);
// Outputs with the conventions' tensor names, dtypes and shapes.
Outputs from_gpu(const Case& k, const gpu::GpuOutputs& g);

// The CPU model of the absorbed (or, o.explicit_form, the explicit) pipeline.
Outputs gpu_model(const Case& k, const gpu::RunOptions& o);
// The kernels on the device (throws without one).
Outputs gpu_device(const Case& k, const gpu::RunOptions& o);

}  // namespace qkmla::impl
