// The GPU part of `qkmla report`: the kernels' CPU model in every GPU profile, the kernels
// themselves where a device exists, and the kernel-vs-model bit comparison.
#pragma once
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"

namespace qkmla {

// gpu.model.<p> and (blockwise only) gpu.model.explicit.<p>; empty for fp64. The split plan uses
// the device's multiprocessor count when one exists (so model and kernel split alike), else 132.
std::vector<Outputs> gpu_model_outputs(const Case& k);

// gpu.absorbed.<p> / gpu.explicit.<p> when a device exists, each compared bit for bit with its
// model (a note per pair). Without a device: no outputs, and `why` is set.
std::vector<Outputs> gpu_device_outputs(const Case& k, const std::vector<Outputs>& models,
                                        std::vector<std::string>& notes, std::string* why);

// "N of M elements differ" between two implementations' common tensors (NaN equals NaN).
std::string bitwise_summary(const Outputs& a, const Outputs& b);

}  // namespace qkmla
