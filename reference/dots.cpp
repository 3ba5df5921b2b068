#include "reference/dots.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>

#include "core/parallel.hpp"
#include "reference/slice_gemm.hpp"

namespace qkmla::ref {

struct Dots::Shared {
  std::mutex m;
  int cached = 8;
  std::map<Key, std::shared_future<std::shared_ptr<const ExactProduct>>> blocks;
  std::deque<Key> order;  // insertion order: the oldest block is dropped first
  double seconds = 0.0;
  int64_t formed = 0;
  std::atomic<int64_t> read{0};
  std::atomic<int> no_ahead{0};  // live NoAhead guards
  int64_t per_product = 0;
  std::shared_ptr<const SlicedWeights> sliced;  // null: extraction (X.1-X.2)
};

namespace {

std::shared_ptr<const ExactProduct> form(const Case& k, const SlicedWeights* sliced, int b,
                                         int64_t t0, int64_t t1) {
  const Tensor& kv = k.latent();
  const Tensor& wt = k.get("w_uk");
  const int64_t r = k.cfg.latent_rank;
  std::vector<double> held;  // the block's rows when the cache is held compact
  const double* rows = t1 > t0 ? kv.rows(kv.index({b, t0, 0}), (t1 - t0) * r, held) : nullptr;
  if (sliced) return std::make_shared<const ExactProduct>(sliced_matmul(rows, r, t1 - t0, *sliced));
  return std::make_shared<const ExactProduct>(
      exact_matmul(rows, r, t1 - t0, r, wt.data.data(), wt.shape[1], wt.shape[1]));
}

// X.5's plan for the product, from every cached token's latent row (so that any blocking of the
// tokens gives the same expansions) and the weights; null when slicing would cost more than
// extraction.
std::shared_ptr<const SlicedWeights> slice_weights(const Case& k) {
  const MlaConfig& c = k.cfg;
  const Tensor& kv = k.latent();
  const Tensor& wt = k.get("w_uk");
  const int64_t r = c.latent_rank;
  Spans a_spans;
  std::vector<double> held;  // rows of a compact cache, 4096 tokens at a time (spans are per row)
  for (int b = 0; b < c.batch; ++b)
    for (int64_t t0 = 0; t0 < c.seqlens[size_t(b)]; t0 += 4096) {
      const int64_t n = std::min<int64_t>(4096, c.seqlens[size_t(b)] - t0);
      a_spans.append(row_spans(kv.rows(kv.index({b, t0, 0}), n * r, held), r, n, r));
    }
  const Slicing plan =
      plan_slicing(a_spans, col_spans(wt.data.data(), wt.shape[1], r, wt.shape[1]), r);
  if (plan.gemms_per_chunk > kMaxSlicedGemms) return nullptr;
  return std::make_shared<const SlicedWeights>(wt.data.data(), wt.shape[1], r, wt.shape[1], plan);
}

}  // namespace

Dots::Dots(const Case& k, Options o) : block_tokens_(o.block_tokens), shared_(new Shared) {
  shared_->cached = o.cached;
  try {
    if (o.sliced) shared_->sliced = slice_weights(k);
  } catch (const std::domain_error&) {  // too wide to slice: extraction checks the range itself
    shared_->sliced = nullptr;
  }
  if (block_tokens_ < 0) block_tokens_ = whole_product_bytes(k) <= o.whole_bytes ? 0 : 256;
  for (int t : k.cfg.seqlens)
    shared_->per_product += streaming() ? (t + block_tokens_ - 1) / block_tokens_ : 1;
  if (streaming()) return;
  // Every sequence's product whole, as Pending blocks: a sliced product's 512-column tiles are
  // tasks of their own, so that one sequence's product runs on every thread (S.1: the same bits).
  std::vector<std::shared_ptr<Pending>> whole;  // [B]
  std::vector<std::function<void()>> tasks;
  for (int b = 0; b < k.cfg.batch; ++b) {
    whole.emplace_back(new Pending(*this, k, b, 0, k.cfg.seqlens[size_t(b)]));
    shared_->blocks[{b, 0}] = whole.back()->done_.get_future().share();
    for (int i = 0; i < whole.back()->pieces(); ++i)
      tasks.push_back([p = whole.back().get(), i] { p->run(i); });
  }
  run_parallel(tasks, std::max(1, o.threads));
}

bool Dots::find_or_enter(const Key& key, Future& found, const Future& fresh) const {
  std::lock_guard<std::mutex> lock(shared_->m);
  auto it = shared_->blocks.find(key);
  if (it != shared_->blocks.end()) {
    found = it->second;  // formed, or being formed by another run
    return true;
  }
  shared_->blocks[key] = fresh;
  shared_->order.push_back(key);
  if (int(shared_->order.size()) > shared_->cached) {
    shared_->blocks.erase(shared_->order.front());  // readers hold their own shared_ptr
    shared_->order.pop_front();
  }
  return false;
}

void Dots::add_time(double seconds, bool formed) const {
  std::lock_guard<std::mutex> lock(shared_->m);
  shared_->seconds += seconds;
  shared_->formed += formed ? 1 : 0;
}

std::shared_ptr<const ExactProduct> Dots::block(const Case& k, int b, int64_t t0) const {
  std::promise<std::shared_ptr<const ExactProduct>> mine;
  Future found;
  if (find_or_enter({b, t0}, found, mine.get_future().share())) return found.get();
  const auto start = std::chrono::steady_clock::now();
  const int64_t t1 = std::min<int64_t>(t0 + block_tokens_, k.cfg.seqlens[size_t(b)]);
  std::shared_ptr<const ExactProduct> p;
  try {
    p = form(k, shared_->sliced.get(), b, t0, t1);
  } catch (...) {  // waiters see the same error; the block stays unformed
    mine.set_exception(std::current_exception());
    throw;
  }
  mine.set_value(p);
  add_time(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), true);
  return p;
}

Dots::Pending::Pending(const Dots& d, const Case& k, int b, int64_t t0, int64_t t1)
    : d_(&d),
      k_(&k),
      b_(b),
      t0_(t0),
      t1_(t1),
      sliced_(t1 > t0 ? d.shared_->sliced.get() : nullptr),  // no rows: form()'s empty product
      pieces_(sliced_ ? int(SlicedProduct::tiles_for(sliced_->k)) : 1),
      left_(pieces_) {}

void Dots::Pending::run(int piece) {
  const auto start = std::chrono::steady_clock::now();
  bool last = false;
  try {
    if (sliced_) {
      std::call_once(sliced_once_, [&] {  // the product keeps its own slices of the rows
        const Tensor& kv = k_->latent();
        const int64_t r = k_->cfg.latent_rank;
        std::vector<double> held;
        product_ = std::make_unique<SlicedProduct>(
            kv.rows(kv.index({b_, t0_, 0}), (t1_ - t0_) * r, held), r, t1_ - t0_, *sliced_);
      });
      product_->tile(piece);
    } else {
      whole_ = form(*k_, nullptr, b_, t0_, t1_);
    }
    last = --left_ == 0;
    if (last && !failed_)
      done_.set_value(sliced_ ? std::make_shared<const ExactProduct>(product_->finish()) : whole_);
  } catch (...) {  // readers see the first error; the block stays unformed
    if (!failed_.exchange(true)) done_.set_exception(std::current_exception());
    throw;
  }
  if (last) product_.reset();
  d_->add_time(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               last);
}

std::shared_ptr<Dots::Pending> Dots::prefetch(const Case& k, int b, int64_t t0) const {
  if (!streaming() || t0 >= k.cfg.seqlens[size_t(b)]) return nullptr;
  const int64_t t1 = std::min<int64_t>(t0 + block_tokens_, k.cfg.seqlens[size_t(b)]);
  std::shared_ptr<Pending> p(new Pending(*this, k, b, t0, t1));
  Future found;
  if (find_or_enter({b, t0}, found, p->done_.get_future().share())) return nullptr;
  return p;
}

Dots::NoAhead::NoAhead(const Dots& d) : d_(d) {
  if (d_.shared_) ++d_.shared_->no_ahead;
}

Dots::NoAhead::~NoAhead() {
  if (d_.shared_) --d_.shared_->no_ahead;
}

Dots::Cursor Dots::cursor(const Case& k, int b, bool counts) const {
  return Cursor(*this, k, b, counts);
}

std::span<const double> Dots::Cursor::entry(int64_t t, int64_t j) {
  if (!block_ || t < t0_ || t >= t1_) {
    const int64_t T = k_->cfg.seqlens[size_t(b_)];
    t0_ = d_->streaming() ? t - t % d_->block_tokens_ : 0;
    t1_ = d_->streaming() ? std::min<int64_t>(t0_ + d_->block_tokens_, T) : T;
    block_.reset();
    if (counts_) ++d_->shared_->read;
    if (ahead_.valid() && ahead_t0_ == t0_) {
      block_ = ahead_.get();
    } else {
      if (ahead_.valid()) ahead_.wait();  // a block this run skipped: let it finish
      block_ = d_->block(*k_, b_, t0_);
    }
    if (d_->streaming() && t1_ < T && d_->shared_->no_ahead == 0) {
      const Dots* d = d_;
      const Case* k = k_;
      const int b = b_;
      const int64_t next = t1_;
      ahead_t0_ = next;
      ahead_ = std::async(std::launch::async, [d, k, b, next] { return d->block(*k, b, next); });
    }
  }
  return block_->entry(t - t0_, j);
}

void Dots::release() {
  if (!shared_) return;
  std::map<Key, Future> gone;  // destroyed outside the lock
  {
    std::lock_guard<std::mutex> lock(shared_->m);
    gone.swap(shared_->blocks);
    shared_->order.clear();
  }
}

double Dots::seconds() const {
  if (!shared_) return 0.0;
  std::lock_guard<std::mutex> lock(shared_->m);
  return shared_->seconds;
}

int64_t Dots::blocks_read() const { return shared_ ? shared_->read.load() : 0; }
int64_t Dots::blocks_per_product() const { return shared_ ? shared_->per_product : 0; }

int64_t Dots::blocks_formed() const {
  if (!shared_) return 0;
  std::lock_guard<std::mutex> lock(shared_->m);
  return shared_->formed;
}

std::string Dots::method() const {
  const SlicedWeights* s = shared_ ? shared_->sliced.get() : nullptr;
  if (!s) return "k0c extraction";
  return "k0c sliced GEMMs (" + std::to_string(s->plan.beta_a) + "+" +
         std::to_string(s->plan.beta_b) + " bits, " + std::to_string(s->plan.slices_a) + "x" +
         std::to_string(s->plan.slices_b) + " slices, " +
         std::to_string(s->plan.remainder_a + s->plan.remainder_b) + " remainders, " +
         slice_gemm_target() + ")";
}

int64_t whole_product_bytes(const MlaConfig& c) {  // w_uk [r, G d_c]
  int64_t tokens = 0;
  for (int t : c.seqlens) tokens += t;
  return tokens * int64_t(c.groups) * c.d_c * ExactProduct::kLevels * 8;
}

int64_t whole_product_bytes(const Case& k) { return whole_product_bytes(k.cfg); }

Dots exact_dots(const Case& k, int64_t whole_bytes, int threads) {
  if (whole_bytes < 0) {
    const char* env = std::getenv("QKMLA_WHOLE_PRODUCTS_MIB");
    whole_bytes = env ? std::strtoll(env, nullptr, 10) << 20 : int64_t(1) << 30;
  }
  Dots::Options o{-1, 4, whole_bytes};
  o.threads = threads;
  return Dots(k, o);
}

}  // namespace qkmla::ref
