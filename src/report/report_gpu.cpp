#include "report/report_gpu.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "impl/gpu_impl.hpp"

namespace qkmla {

namespace {
int plan_sm_count() {
  const int n = gpu::device_sm_count();
  return n > 0 ? n : gpu::RunOptions{}.sm_count;
}

bool same_bits(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  const float fa = float(a), fb = float(b);
  return std::memcmp(&fa, &fb, sizeof fa) == 0;
}
}  // namespace

std::vector<Outputs> gpu_model_outputs(const Case& k) {
  std::vector<Outputs> out;
  if (!impl::gpu_profile(k.cfg.profile)) return out;
  gpu::RunOptions o;
  o.sm_count = plan_sm_count();
  out.push_back(impl::gpu_model(k, o));
  if (k.cfg.norm == NormMode::Blockwise) {
    o.explicit_form = true;
    out.push_back(impl::gpu_model(k, o));
  }
  return out;
}

std::string bitwise_summary(const Outputs& a, const Outputs& b) {
  int64_t total = 0, differ = 0;
  std::string first;
  for (const auto& [name, ta] : a.tensors) {
    if (!b.tensors.count(name)) continue;
    const Tensor& tb = b.tensors.at(name);
    for (int64_t i = 0; i < ta.numel() && i < tb.numel(); ++i, ++total)
      if (!same_bits(ta[i], tb[i]) && differ++ == 0)
        first = fmt::format(" (first: {} flat {}: {:.9g} vs {:.9g})", name, i, ta[i], tb[i]);
  }
  if (differ == 0)
    return fmt::format("{} vs {}: bit-identical on all {} elements", a.impl, b.impl, total);
  return fmt::format("{} vs {}: {} of {} elements differ{}", a.impl, b.impl, differ, total, first);
}

std::vector<Outputs> gpu_device_outputs(const Case& k, const std::vector<Outputs>& models,
                                        std::vector<std::string>& notes, std::string* why) {
  std::vector<Outputs> out;
  if (!impl::gpu_profile(k.cfg.profile) || !gpu::device_available(why)) return out;
  gpu::RunOptions o;
  o.sm_count = plan_sm_count();
  for (const Outputs& m : models) {
    o.explicit_form = m.impl.find(".explicit.") != std::string::npos;
    Outputs d = impl::gpu_device(k, o);
    notes.push_back(bitwise_summary(d, m));
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace qkmla
