// qkmla's public C++ API (installed as <qkmla/qkmla.hpp>, target qkmla::qkmla): golden cases and
// audits for a kernel's own test suite, the same code the CLI runs (`qkmla golden`, `qkmla
// audit`). Standard types only: no Eigen, Boost, fmt or CUDA in this interface.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace qkmla::api {

// A tensor by value: its dtype in safetensors spelling ("F64", "F32", "BF16", "F16", "F8_E4M3",
// "I32"), its shape, and its values as doubles (every value of those dtypes is a double exactly).
struct Array {
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  std::vector<double> values;
};

// What `qkmla golden` takes. Dims left at 0 (d_r at -1) come from the preset; `inputs` are the
// user's own conventions §2 tensors (config from `config_json` or inferred from shapes and dtypes).
struct CaseOptions {
  std::string preset = "tiny", profile = "bf16", level = "module", scenario = "normal";
  std::string norm = "blockwise", rope_order = "norm_then_rope", rope_style = "interleaved";
  std::vector<int> seqlens{64};
  int sq = 1;
  uint64_t seed = 1;
  int heads = 0, groups = 0, latent_rank = 0, d_c = 0, d_r = -1, d_v = 0;
  bool causal = true;
  int ref_bits = 113;
  std::map<std::string, Array> inputs;  // empty: generated from the seed
  std::string config_json;              // conventions §9 keys applied last ("" = none)
  bool round_inputs = false;            // inputs: round what the profile cannot store (RNE)
  std::string layout = "dense";  // "flashmla"/"flashinfer": also the paged inputs (docs/layouts.md)
  int page_size = 64;            // tokens per page of `layout`
};

class GoldenCase {
 public:
  std::string config_json() const;         // conventions §9 keys
  std::vector<std::string> names() const;  // inputs first, then ref.*
  Array tensor(const std::string& name) const;
  std::map<std::string, std::string> metadata() const;
  void save(const std::string& path) const;  // safetensors, as `qkmla golden -o` writes it
  struct State;
  explicit GoldenCase(std::shared_ptr<const State> s) : s_(std::move(s)) {}

 private:
  std::shared_ptr<const State> s_;
  friend struct Access;
};

// Throws std::invalid_argument with the CLI's message (field or file, tensor and problem) on bad
// options, and std::runtime_error when the reference is not accurate enough.
GoldenCase golden(const CaseOptions& o);
GoldenCase load(const std::string& path);

struct AuditOptions {
  std::string label = "third_party";
  std::string lse_base = "e";      // "e" or "2"
  std::string empty_lse = "-inf";  // "-inf", "+inf" or "nan": the outputs' empty-row lse
  std::string form;    // "absorbed", "explicit", or "" (undeclared: both where affordable)
  std::string design;  // e.g. "q_latent=bf16,p=bf16,out=bf16" ("" = inferred)
  int kv_chunk = 0;    // > 0: KV chunks of this many tokens merged by lse (`--kv-chunk`)
  bool diagnose = true;
  std::string layout = "dense";  // the outputs as "flashmla" or "flashinfer" returns them
};

struct TensorVerdict {
  std::string tensor;
  bool passed = false;
  double rel_l2 = 0, max_ulp = 0, baseline_ratio = 0, yardstick = 0;
  int64_t nonfinite_mismatch = 0;
  std::vector<std::string> failed;  // the failed checks, e.g. "baseline_ratio=7.1>4 (...)"
};

struct Verdict {
  bool passed = false;
  std::vector<TensorVerdict> rows;
  std::vector<std::string> diagnosis;  // conventions the outputs match, best first
  std::vector<std::string> missing;    // primary outputs not given
  std::string table;                   // exactly what `qkmla audit` prints
  std::string json;                    // `qkmla audit --format json`
};

// Judges `outputs` (out, lse, latent_out, alpha_k, ...) against the case, as `qkmla audit` does.
Verdict audit(const GoldenCase& c, const std::map<std::string, Array>& outputs,
              const AuditOptions& o = {});

}  // namespace qkmla::api
