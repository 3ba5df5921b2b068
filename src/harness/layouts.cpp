#include "harness/layouts.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/rng.hpp"
#include "io/safetensors.hpp"

namespace qkmla {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// pages[b][j]: the page holding tokens j*P ... j*P+P-1 of sequence b; `total` counts the spare
// page.
struct Paging {
  std::vector<std::vector<int64_t>> pages;
  int64_t total = 0;
};

Paging assign_pages(const MlaConfig& c, int P) {
  Paging g;
  int64_t used = 0;
  for (int t : c.seqlens) used += (t + P - 1) / P;
  g.total = used + 1;  // one page no sequence owns: poisoned, never a valid read
  std::vector<int64_t> order(size_t(g.total));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(c.seed ^ 0x9a6e5ull);  // shuffled: a kernel that assumes contiguous pages fails
  for (size_t i = order.size() - 1; i > 0; --i)
    std::swap(order[i], order[size_t(rng.uniform() * double(i + 1))]);
  size_t next = 0;
  for (int t : c.seqlens) {
    g.pages.emplace_back();
    for (int j = 0; j < (t + P - 1) / P; ++j) g.pages.back().push_back(order[next++]);
  }
  return g;
}

// Copies width values of each cached token of every sequence into cache [pages, P, ld] at
// column `col` (the rest stays NaN).
void scatter(const Tensor& dense, const MlaConfig& c, const Paging& g, int P, Tensor& cache,
             int64_t ld, int64_t col) {
  const int64_t width = dense.shape[2];
  for (int b = 0; b < c.batch; ++b)
    for (int64_t t = 0; t < c.seqlens[size_t(b)]; ++t) {
      const int64_t slot = g.pages[size_t(b)][size_t(t / P)] * P + t % P;
      for (int64_t j = 0; j < width; ++j) cache[slot * ld + col + j] = dense.at({b, t, j});
    }
}

Tensor i32(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  Tensor t(DType::I32, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t[int64_t(i)] = double(values[i]);
  return t;
}

// Query-side tensors [B, S_q, H, w] concatenated along the last axis (FlashMLA's q).
Tensor concat_last(const Tensor& a, const Tensor& b) {
  const int64_t wa = a.shape.back(), wb = b.shape.back(),
                rows = a.numel() / std::max<int64_t>(wa, 1);
  std::vector<int64_t> shape = a.shape;
  shape.back() = wa + wb;
  Tensor t(a.dtype, shape);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t j = 0; j < wa; ++j) t[n * (wa + wb) + j] = a[n * wa + j];
    for (int64_t j = 0; j < wb; ++j) t[n * (wa + wb) + wa + j] = b[n * wb + j];
  }
  return t;
}

Tensor reshaped(Tensor t, std::vector<int64_t> shape) {
  t.shape = std::move(shape);
  return t;
}

// FlashMLA's fp8 cache (fp8-block128): per slot the r e4m3 codes, the ceil(r/128) fp32 scales and
// the d_r bf16 rope values, as little-endian bytes (656 at r = 512, d_r = 64). Unfilled slots are
// 0xFF bytes: NaN in each of the three formats.
Tensor packed_fp8_cache(const Case& k, const Paging& g, int P) {
  const MlaConfig& c = k.cfg;
  const int64_t r = c.latent_rank, dr = c.d_r, nb = (r + 127) / 128, w = r + 4 * nb + 2 * dr;
  Tensor cache(DType::U8, {g.total, P, 1, w}, 255.0);
  const Tensor &codes = k.get("kv_c"), &scale = k.get("kv_c_scale"), &rope = k.get("k_rope");
  for (int b = 0; b < c.batch; ++b)
    for (int64_t t = 0; t < c.seqlens[size_t(b)]; ++t) {
      double* slot = cache.data.data() + (g.pages[size_t(b)][size_t(t / P)] * P + t % P) * w;
      for (int64_t l = 0; l < r; ++l) slot[l] = encode_e4m3(codes.at({b, t, l}));
      for (int64_t j = 0; j < nb; ++j) {
        const float s = float(scale.at({b, t, j}));
        unsigned char bytes[4];
        std::memcpy(bytes, &s, 4);
        for (int q = 0; q < 4; ++q) slot[r + 4 * j + q] = bytes[q];
      }
      for (int64_t j = 0; j < dr; ++j) {
        const uint16_t u = encode16(DType::BF16, rope.at({b, t, j}));
        slot[r + 4 * nb + 2 * j] = u & 0xFF, slot[r + 4 * nb + 2 * j + 1] = u >> 8;
      }
    }
  return cache;
}

void add_flashmla(const Case& k, const Paging& g, int P, std::map<std::string, Tensor>& out) {
  const MlaConfig& c = k.cfg;
  const int64_t r = c.latent_rank, dr = c.d_r, w = r + dr;
  out["flashmla.q"] = concat_last(k.get("q_latent"), k.get("q_rope"));
  if (c.profile == Profile::FP8_B128) {
    out["flashmla.k_cache"] = packed_fp8_cache(k, g, P);
  } else {
    Tensor cache(k.get("kv_c").dtype, {g.total, P, 1, w}, kNaN);
    scatter(k.get("kv_c"), c, g, P, cache, w, 0);
    scatter(k.get("k_rope"), c, g, P, cache, w, r);
    out["flashmla.k_cache"] = std::move(cache);
  }
  size_t max_blocks = 1;
  for (const auto& p : g.pages) max_blocks = std::max(max_blocks, p.size());
  std::vector<int64_t> table(size_t(c.batch) * max_blocks, -1);
  for (size_t b = 0; b < g.pages.size(); ++b)
    std::copy(g.pages[b].begin(), g.pages[b].end(), table.begin() + long(b * max_blocks));
  out["flashmla.block_table"] = i32({c.batch, int64_t(max_blocks)}, table);
  out["flashmla.cache_seqlens"] =
      i32({c.batch}, std::vector<int64_t>(c.seqlens.begin(), c.seqlens.end()));
  if (c.norm != NormMode::None) {
    out["flashmla.alpha_q"] = k.get("alpha_q");
    Tensor ak(DType::F32, {g.total, P, c.groups}, kNaN);
    scatter(k.get("alpha_k"), c, g, P, ak, c.groups, 0);
    out["flashmla.alpha_k_cache"] = std::move(ak);
  }
  if (c.topk > 0) {  // FlashMLA's sparse interface: global cache slots page * P + offset, -1 kept
    Tensor ix = k.get("indices");
    for (int64_t n = 0; n < ix.numel(); ++n)
      if (ix[n] >= 0) {
        const int b = int(n / (int64_t(c.s_q) * c.topk));
        const int64_t t = int64_t(ix[n]);
        ix[n] = double(g.pages[size_t(b)][size_t(t / P)] * P + t % P);
      }
    out["flashmla.indices"] = std::move(ix);
  }
  if (c.attn_sink) out["flashmla.attn_sink"] = k.get("attn_sink");  // [H] fp32
}

void add_flashinfer(const Case& k, const Paging& g, int P, std::map<std::string, Tensor>& out) {
  const MlaConfig& c = k.cfg;
  const int64_t N = int64_t(c.batch) * c.s_q, r = c.latent_rank, dr = c.d_r;
  out["flashinfer.q_nope"] = reshaped(k.get("q_latent"), {N, c.heads, r});
  out["flashinfer.q_pe"] = reshaped(k.get("q_rope"), {N, c.heads, dr});
  Tensor ckv(k.get("kv_c").dtype, {g.total, P, r}, kNaN),
      kpe(k.get("k_rope").dtype, {g.total, P, dr}, kNaN);
  scatter(k.get("kv_c"), c, g, P, ckv, r, 0);
  scatter(k.get("k_rope"), c, g, P, kpe, dr, 0);
  out["flashinfer.ckv_cache"] = std::move(ckv);
  out["flashinfer.kpe_cache"] = std::move(kpe);
  if (is_fp8(c.profile)) {  // [pages, P] per token, or [pages, P, ceil(r/128)] per block
    const Tensor& dense = k.get("kv_c_scale");
    const int64_t per = dense.shape.size() == 3 ? dense.shape[2] : 1;
    Tensor s(DType::F32,
             per > 1 || dense.shape.size() == 3 ? std::vector<int64_t>{g.total, P, per}
                                                : std::vector<int64_t>{g.total, P},
             kNaN);
    scatter(reshaped(dense, {dense.shape[0], dense.shape[1], per}), c, g, P, s, per, 0);
    out["flashinfer.ckv_scale_cache"] = std::move(s);
  }
  std::vector<int64_t> qo{0}, kv{0}, indices, last;
  for (int b = 0; b < c.batch; ++b) {
    qo.push_back(qo.back() + c.s_q);
    const auto& p = g.pages[size_t(b)];
    indices.insert(indices.end(), p.begin(), p.end());
    kv.push_back(kv.back() + int64_t(p.size()));
    const int T = c.seqlens[size_t(b)];
    last.push_back(T == 0 ? 0 : T - (int64_t(p.size()) - 1) * P);
  }
  out["flashinfer.qo_indptr"] = i32({c.batch + 1}, qo);
  out["flashinfer.kv_indptr"] = i32({c.batch + 1}, kv);
  out["flashinfer.kv_indices"] = i32({int64_t(indices.size())}, indices);
  out["flashinfer.kv_len"] =
      i32({c.batch}, std::vector<int64_t>(c.seqlens.begin(), c.seqlens.end()));
  out["flashinfer.kv_last_page_len"] = i32({c.batch}, last);
  if (c.norm != NormMode::None) {
    out["flashinfer.alpha_q"] = reshaped(k.get("alpha_q"), {N, c.heads});
    Tensor ak(DType::F32, {g.total, P, c.groups}, kNaN);
    scatter(k.get("alpha_k"), c, g, P, ak, c.groups, 0);
    out["flashinfer.alpha_k_cache"] = std::move(ak);
  }
}

const Tensor& need(const std::map<std::string, Tensor>& given, const std::string& name,
                   const std::vector<int64_t>& shape, const std::string& file,
                   const std::string& layout) {
  const auto it = given.find(name);
  if (it == given.end())
    throw InputError(file, name,
                     "missing: the " + layout + " layout's outputs are " +
                         (layout == "flashmla" ? "out and softmax_lse" : "o and lse"));
  if (it->second.shape != shape)
    throw InputError(file, name,
                     "shape " + shape_str(it->second.shape) + ", the " + layout + " layout's is " +
                         shape_str(shape));
  return it->second;
}

}  // namespace

Layout parse_layout(const std::string& s) {
  if (s == "dense") return Layout::Dense;
  if (s == "flashmla") return Layout::FlashMla;
  if (s == "flashinfer") return Layout::FlashInfer;
  throw ConfigError("layout", "unknown layout '" + s + "' (dense, flashmla, flashinfer)");
}

std::string layout_name(Layout l) {
  return l == Layout::FlashMla ? "flashmla" : l == Layout::FlashInfer ? "flashinfer" : "dense";
}

std::map<std::string, Tensor> paged_inputs(const Case& k, Layout l, int page_size) {
  const MlaConfig& c = k.cfg;
  if (c.level != Level::Kernel)
    throw ConfigError("layout", "a paged layout needs a kernel-level case (--level kernel)");
  if (page_size < 1) throw ConfigError("page_size", "must be at least 1");
  if (l == Layout::FlashMla && c.profile == Profile::FP8)
    throw ConfigError("layout",
                      "flashmla with the fp8 profile (one scale per token): FlashMLA's fp8 cache "
                      "has one scale per 128 values; use --profile fp8-block128");
  if (l == Layout::FlashInfer && (c.topk > 0 || c.attn_sink))
    throw ConfigError("layout",
                      "flashinfer: its MLA paged interface takes neither top-k indices nor sinks "
                      "(use --layout flashmla, or the dense case)");
  std::map<std::string, Tensor> out;
  if (l == Layout::Dense) return out;
  const Paging g = assign_pages(c, page_size);
  if (l == Layout::FlashMla)
    add_flashmla(k, g, page_size, out);
  else
    add_flashinfer(k, g, page_size, out);
  return out;
}

std::map<std::string, Tensor> outputs_from_layout(const MlaConfig& c, Layout l,
                                                  std::map<std::string, Tensor> given,
                                                  const std::string& file) {
  if (l == Layout::Dense) return given;
  const int64_t B = c.batch, S = c.s_q, H = c.heads, r = c.latent_rank;
  const std::string name = layout_name(l);
  const bool mla = l == Layout::FlashMla;
  const Tensor& o =
      need(given, mla ? "out" : "o",
           mla ? std::vector<int64_t>{B, S, H, r} : std::vector<int64_t>{B * S, H, r}, file, name);
  const Tensor& lse_in =
      need(given, mla ? "softmax_lse" : "lse",
           mla ? std::vector<int64_t>{B, H, S} : std::vector<int64_t>{B * S, H}, file, name);
  std::map<std::string, Tensor> out;
  out["latent_out"] = reshaped(o, {B, S, H, r});
  Tensor lse(lse_in.dtype, {B, S, H});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t h = 0; h < H; ++h) {
        lse.at({b, i, h}) = mla ? lse_in.at({b, h, i}) : lse_in.at({b * S + i, h});
      }
  out["lse"] = std::move(lse);
  for (auto& [n, t] : given)  // anything else the file holds is passed on (judged if known)
    if (n != (mla ? "out" : "o") && n != (mla ? "softmax_lse" : "lse")) out[n] = std::move(t);
  return out;
}

namespace {

const TensorAudit* audited(const AuditResult& r, const std::string& name) {
  for (const TensorAudit& a : r.tensors)
    if (a.j.tensor == name) return &a;
  return nullptr;
}

}  // namespace

AuditResult audit_in_layout(const CaseFile& cf, const std::string& case_path, Layout l,
                            const std::map<std::string, Tensor>& given,
                            const std::string& outputs_path, const AuditOptions& o) {
  AuditResult r = run_audit(cf, case_path, outputs_from_layout(cf.k.cfg, l, given, outputs_path),
                            outputs_path, o);
  const TensorAudit* lse = audited(r, "lse");
  if (l != Layout::FlashMla || r.pass() || !lse || lse->j.v.pass ||
      cf.k.cfg.s_q * cf.k.cfg.heads < 2)
    return r;
  // softmax_lse's buffer read in qkmla's own order [B, S_q, H]: the shape FlashMLA gives it kept.
  std::map<std::string, Tensor> alt = outputs_from_layout(cf.k.cfg, l, given, outputs_path);
  Tensor& x = alt.at("lse");
  x.data = given.at("softmax_lse").data;
  AuditOptions quiet = o;
  quiet.diagnose = false;
  const AuditResult a = run_audit(cf, case_path, alt, outputs_path, quiet);
  const TensorAudit* alse = audited(a, "lse");
  if (!alse || !alse->j.v.pass) return r;
  Match m{"softmax_lse_order=[B,S_q,H]",
          "softmax_lse written in [B, S_q, H] order, not FlashMLA's [B, H, S_q]: transpose it",
          {{"lse", alse->j.m.rel_l2, lse->j.m.rel_l2}},
          alse->j.m.rel_l2 / std::max(lse->j.m.rel_l2, 1e-300),
          true};
  r.diagnosis.insert(r.diagnosis.begin(), m);
  return r;
}

}  // namespace qkmla
