// The GPU implementations as report rows: gpu.model.<profile> (the kernels' CPU model, always),
// gpu.absorbed.<profile> and gpu.explicit.<profile> (the kernels, only where a device exists).
// Both read the same GpuCase, converted once from the case's bits.
#pragma once
#include <string>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "qkmla_gpu.hpp"

namespace qkmla::impl {

// Profiles the kernels implement: fp32, bf16, fp16, fp8 (not fp64).
bool gpu_profile(Profile p);
// The case's tensors as fp32 values of their bits (exact: every stored format fits in fp32).
gpu::GpuCase to_gpu_case(const Case& k);
// Outputs with the SPEC's tensor names, dtypes and shapes; `impl` is the report id.
Outputs from_gpu(const Case& k, const gpu::GpuOutputs& g, const std::string& impl);

// gpu.model.<profile> (absorbed) or gpu.model.explicit.<profile>.
Outputs gpu_model(const Case& k, const gpu::RunOptions& o);
// gpu.absorbed.<profile> or gpu.explicit.<profile> on the device (throws without one).
Outputs gpu_device(const Case& k, const gpu::RunOptions& o);

}  // namespace qkmla::impl
