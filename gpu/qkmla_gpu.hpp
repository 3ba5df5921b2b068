// Host API of the GPU kernels and of their CPU model. No CUDA type appears here: the report, the
// tests and the CLI include this header with any C++ compiler, with or without a CUDA toolkit.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "gpu/dims.hpp"

namespace qkmla::gpu {

// One case as the kernels read it: every tensor as the fp32 values of its stored bits (uploading
// converts them back to those bits exactly). Shapes follow conventions §2; the cache is dense per
// sequence here and paged by the pipeline (pipeline.hpp, plan.hpp).
struct GpuCase {
  Dims d;
  std::vector<int> seqlens;         // [B]
  std::vector<float> q_nope, q_pe;  // [B, S_q, H, d_c], [B, S_q, H, d_r]
  std::vector<float> kv_c;          // [B, t_max, r]   (fp8: the e4m3 code values)
  // The CPU model may read the latent cache a block of tokens at a time instead, when kv_c is
  // empty: rows [t0, t0 + n) of sequence b, the same fp32 values, into rows [n, r]. A long context
  // then holds no fp32 copy of the whole cache beside the model's paged one. The device needs kv_c.
  std::function<void(int b, int t0, int n, float* rows)> kv_c_rows;
  std::vector<float> kv_c_scale;  // [B, t_max]      (fp8 only; empty otherwise)
  std::vector<float> k_pe;        // [B, t_max, d_r]
  std::vector<float> w_uk, w_uv;  // [r, G*d_c], [r, G*d_v]
  std::vector<float> g_q,
      g_k;  // blockwise: gamma_cq, gamma_ck [d_c]; unified: gamma_q, gamma_k [d_c+d_r]
  std::vector<float> g_rq, g_rk;  // blockwise: gamma_rq, gamma_rk [d_r]; unified: the rope halves
  std::vector<float> rope_cos, rope_sin;  // [p_max, d_r/2]
};

struct RunOptions {
  bool explicit_form = false;  // gpu.explicit: full normalized keys and values cached per group
  bool qk_norm = true;      // false: the alpha_q * alpha_k scaling disabled (plain MLA, bench only)
  int pages_per_split = 0;  // 0: chosen from the work size and sm_count (plan.hpp)
  int sm_count = 132;       // H200; the model uses the same number so that both split alike
};

struct GpuOutputs {
  std::vector<float> out;         // [B, S_q, H, d_v], stored-format values
  std::vector<float> lse;         // [B, S_q, H], natural log
  std::vector<float> latent_out;  // [B, S_q, H, r] rounded to the stored format (absorbed only)
  std::vector<float> alpha_q;     // [B, S_q, H]
  std::vector<float> alpha_k;     // [B, t_max, G], NaN past T_b (absorbed only)
  int pages_per_split = 0, max_splits = 0;
  double decode_ms = 0;  // device only: decode + combine, CUDA events
  std::string device;    // "cpu model" or the device name
};

// The CPU model: the same stages in the same order (always available).
GpuOutputs run_model(const GpuCase& c, const RunOptions& o);
// The split-KV plan run_model and run_on_device use for these shapes and sequence lengths (only
// S_q, H and G of d matter): pages per split and the most splits of any sequence.
struct SplitInfo {
  int pages_per_split = 0, max_splits = 0, page_tokens = 0;
};
SplitInfo split_info(const Dims& d, const std::vector<int>& seqlens, const RunOptions& o);

// True when a CUDA device can run the kernels; otherwise `why` says what is missing (no toolkit at
// build time, no device, no driver).
bool device_available(std::string* why);
// Runs the pipeline on device 0 (append, query, decode, combine, up-projection). Throws
// std::runtime_error naming the failing CUDA call.
GpuOutputs run_on_device(const GpuCase& c, const RunOptions& o);
// The device's multiprocessor count (for the model's split plan); 0 without a device.
int device_sm_count();
// The architectures the kernels were compiled for, as nvcc's __CUDA_ARCH_LIST__ ("800,900"; the
// sm_90a build reports 900); empty in a build without CUDA.
std::string compiled_arch_list();
// "NVIDIA H200, sm_90, 132 SMs, driver 13.0, runtime 13.0", or empty without a device.
std::string device_description();
// Kernel launches made by run_on_device in this process (counted where they are made, so a
// sanitizer run can prove that it checked something); 0 without CUDA.
long device_launch_count();

// `qkmla bench`: the paper's decode table (conventions §12), on the device only.
struct BenchRow {
  int batch = 0, heads = 0, groups = 0, context = 0;
  double ms_norm = 0, ms_plain = 0;          // medians, decode + combine
  double spread_norm = 0, spread_plain = 0;  // (p90 - p10) / median
  double overhead_pct = 0;
  double gbs_norm = 0, hbm_fraction = 0;  // bytes read / time; against the datasheet's 4.8 TB/s
  double cache_bytes = 0, cache_bytes_alpha = 0;
  int pages_per_split = 0, splits = 0;  // the split plan this row ran with (splits per sequence)
  double partial_bytes = 0;  // fp32 split partials (o and lse), written once and read once
};
struct BenchOptions {
  int batch = 4, heads = 16, groups = 16, r = 512, d_c = 128, d_r = 64;
  std::vector<int> contexts{4096, 8192, 16384, 32768, 65536, 131072, 196608, 262144};
  int warmup = 10, reps = 50;
  int pages_per_split = 0;  // 0: the plan's choice (plan.hpp); N: every split N pages (a sweep)
};
std::vector<BenchRow> run_bench(const BenchOptions& o, std::string* device);
// One row of run_bench (throws without a device).
BenchRow run_bench_row(const BenchOptions& o, int context);
// Device-to-device copy bandwidth, (bytes read + bytes written) / time, median of `reps` copies of
// `bytes` (cudaMemcpyAsync, CUDA events).
double measure_copy_gbs(size_t bytes, int reps);

}  // namespace qkmla::gpu
