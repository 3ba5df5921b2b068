// Benchmark (not a test): the X.5 slice GEMM on every Highway target this CPU has, against
// Eigen's GEMM built with the project's flags, on one [256 x r] . [r x 512] slice pair of the
// paper-decode bf16 case (real latent rows and weights, sliced as the reference slices them), and
// the whole sliced product of one 256-token block. Prints times and ratios measured in one run.
// Usage: qkmla_bench_slice_gemm [repetitions]
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/generator.hpp"
#include "core/presets.hpp"
#include "gemm/ordered_gemm.hpp"
#include "reference/slice_gemm.hpp"
#include "reference/sliced_product.hpp"

using namespace qkmla;

namespace {

// Median seconds of `reps` calls of f.
double median_seconds(int reps, const std::function<void()>& f) {
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 9;
  MlaConfig c = config_for(find_preset("paper-decode"), 256);
  c.profile = Profile::BF16;
  const Case k = generate_case(c);
  const int64_t m = 256, r = c.latent_rank, cols = 512;
  const Tensor& kv = k.latent();
  const Tensor& wk = k.get("w_uk");
  const int64_t k_all = wk.shape[1];
  const ref::Slicing plan = ref::plan_slicing(ref::row_spans(kv.data.data(), r, m, r),
                                              ref::col_spans(wk.data.data(), k_all, r, k_all), r);
  const ref::SlicedWeights W(wk.data.data(), k_all, r, k_all, plan);
  // One slice pair as the GEMM sees it: the top slice of the rows (integers times a power of two
  // per row; the scale does not change the work) and the weights' top slice, 512 columns.
  std::vector<double> a(size_t(m * r));
  for (int64_t i = 0; i < m * r; ++i) a[size_t(i)] = std::trunc(kv.data[size_t(i)] * 256.0);
  const double* b = W.slices[0].data();
  std::vector<double> out(size_t(m * cols));
  using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const Matrix> am(a.data(), m, r);
  const Eigen::Map<const Matrix, 0, Eigen::OuterStride<>> bm(b, r, cols,
                                                             Eigen::OuterStride<>(k_all));
  Matrix cm(m, cols);
  const double eigen = median_seconds(reps, [&] { cm.noalias() = am * bm; });
  const double macs = double(m) * double(r) * double(cols);
  std::printf("slice GEMM [%lld x %lld] . [%lld x %lld], median of %d, paper-decode bf16 slices\n",
              (long long)m, (long long)r, (long long)r, (long long)cols, reps);
  std::printf("  %-8s %8.3f ms  %.2e MAC/s  (1.00x)\n", "Eigen", eigen * 1e3, macs / eigen);
  gemm::for_each_simd_target([&](const std::string& target) {
    const double t = median_seconds(
        reps, [&] { ref::slice_gemm(a.data(), r, b, k_all, out.data(), cols, m, r, cols); });
    bool same = true;
    for (int64_t i = 0; i < m * cols; ++i) same = same && out[size_t(i)] == cm.data()[i];
    std::printf("  %-8s %8.3f ms  %.2e MAC/s  (%.2fx Eigen's speed)%s\n", target.c_str(), t * 1e3,
                macs / t, eigen / t, same ? "" : "  RESULTS DIFFER");
  });
  const double block = median_seconds(reps, [&] { ref::sliced_matmul(kv.data.data(), r, m, W); });
  std::printf(
      "whole sliced product of one 256-token block, k0c [%lld x %lld], %d x %d slices, "
      "dispatched %s: %.2f ms\n",
      (long long)m, (long long)k_all, plan.slices_a, plan.slices_b,
      ref::slice_gemm_target().c_str(), block * 1e3);
}
