// X.1-X.2: the exact product ref.explicit's keys start from, per batch entry b:
// k0c[b] = kv_c[b, :T_b] * w_uk  [T_b, G*d_c]. (Its values need no product: E.7 multiplies the
// exact sums sum_t p c[t] by w_uv instead, X.8.)
//
// Every entry's expansion depends only on its own token row and the weights (exact_dot.hpp), so
// the products may be formed a block of tokens at a time: the same bits either way. Short
// contexts are formed whole, once, and shared by every run. Long contexts stream: blocks are formed
// when a run first reads them, shared with any run reading them while they are cached, and at most
// `cached` blocks are kept, so memory is independent of the context length (proofs/reference.md,
// "Streaming").
#pragma once
#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "core/case.hpp"
#include "reference/exact_dot.hpp"
#include "reference/sliced_product.hpp"

namespace qkmla::ref {

class Dots {
 public:
  struct Options {
    // 0: every sequence whole, formed at construction; < 0: whole if the products fit in
    // whole_bytes, else 256-token blocks.
    int64_t block_tokens = 0;
    int cached =
        4;  // streaming: blocks kept (two runs at once, each reading one, forming the next)
    int64_t whole_bytes = int64_t(1) << 30;
    // X.5 sliced GEMMs where their plan needs at most kMaxSlicedGemms per chunk; X.1-X.2 extraction
    // otherwise (operands spanning very many binades). Either way the same exact values.
    bool sliced = true;
    int threads = 1;  // whole products: their 512-column tiles formed on this many threads
  };

  Dots() = default;
  Dots(const Case& k, Options o);

  // Reads the product of sequence b in increasing (or any) token order; holds the block it read
  // last, so an entry stays valid until the next entry() call on this cursor. Streaming, it forms
  // the next block on a helper thread while the run reads this one (the products are plain double
  // arithmetic, the run's multiprecision stages the rest: the two overlap).
  class Cursor {
   public:
    std::span<const double> entry(int64_t t, int64_t j);

   private:
    friend class Dots;
    Cursor(const Dots& d, const Case& k, int b, bool counts)
        : d_(&d), k_(&k), b_(b), counts_(counts) {}
    const Dots* d_;
    const Case* k_;
    int b_;
    bool counts_;
    int64_t t0_ = 0, t1_ = 0;
    std::shared_ptr<const ExactProduct> block_;
    int64_t ahead_t0_ = -1;
    std::future<std::shared_ptr<const ExactProduct>> ahead_;  // the block from ahead_t0_
  };
  // k: the case the products were made for (Dots keeps no pointer to it: cases move). `counts`:
  // this cursor's moves count towards blocks_read() (a run with several threads counts one).
  Cursor cursor(const Case& k, int b, bool counts = true) const;

  // A block that a streaming runner forms ahead on its own threads (ref_explicit_pair), so that
  // no helper thread competes with them: pieces() parts (512-column tiles of the sliced GEMMs;
  // one part for extraction), each run once, distinct parts concurrently. The last part to end
  // puts the block in the cache, where readers already wait for it.
  class Pending {
   public:
    int pieces() const { return pieces_; }
    void run(int piece);

   private:
    friend class Dots;
    Pending(const Dots& d, const Case& k, int b, int64_t t0, int64_t t1);
    const Dots* d_;
    const Case* k_;
    int b_;
    int64_t t0_, t1_;
    const SlicedWeights* sliced_;  // null: extraction, one piece
    int pieces_;
    std::once_flag sliced_once_;
    std::unique_ptr<SlicedProduct> product_;  // sliced: made by the first part to run
    std::shared_ptr<const ExactProduct> whole_;
    std::promise<std::shared_ptr<const ExactProduct>> done_;
    std::atomic<int> left_;
    std::atomic<bool> failed_{false};
  };
  // The block of sequence b's product from token t0, to be formed by its pieces; null when the
  // products are not streamed or the block is cached or being formed already.
  std::shared_ptr<Pending> prefetch(const Case& k, int b, int64_t t0) const;
  // While one lives, cursors form no blocks ahead on helper threads: the runner prefetches.
  class NoAhead {
   public:
    explicit NoAhead(const Dots& d);
    ~NoAhead();
    NoAhead(const NoAhead&) = delete;
    NoAhead& operator=(const NoAhead&) = delete;

   private:
    const Dots& d_;
  };

  // Drops every block held (a copy of this Dots shares them): the products are done with, so
  // their arrays go back to the pool (exact_dot.hpp) for the next case's; statistics stay.
  void release();
  double seconds() const;  // time spent forming products, over all threads
  // Blocks the runs' cursors have moved to so far (progress: a streamed ref.explicit run reads
  // each sequence's blocks once).
  int64_t blocks_read() const;
  int64_t blocks_per_product() const;  // over the batch: 1 per sequence when whole
  int64_t blocks_formed() const;  // streaming: > blocks in the case when runs did not share them
  bool streaming() const { return block_tokens_ > 0; }
  int64_t block_tokens() const { return block_tokens_; }  // 0 when whole
  // X.5 slicing of the product (null: extraction), and how it is formed, for reports.
  std::string method() const;

 private:
  using Key = std::pair<int, int64_t>;  // (b, first token)
  using Future = std::shared_future<std::shared_ptr<const ExactProduct>>;
  std::shared_ptr<const ExactProduct> block(const Case& k, int b, int64_t t0) const;
  // Under the lock: the cached (or pending) block of `key`, else `fresh` entered as that block.
  bool find_or_enter(const Key& key, Future& found, const Future& fresh) const;
  void add_time(double seconds, bool formed) const;

  int64_t block_tokens_ = 0;
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

// The products of a case: whole when the case's exact products (their expansions) fit in
// `whole_bytes`, streamed by 256-token blocks otherwise. -1: QKMLA_WHOLE_PRODUCTS_MIB from the
// environment if set (0 streams every case), else 1 GiB (every preset at its default context is
// formed whole). `threads`: the threads that form a case's whole products (tile by tile).
Dots exact_dots(const Case& k, int64_t whole_bytes = -1, int threads = 1);
// The bytes of a case's products formed whole, at most (every entry's kLevels inline terms).
int64_t whole_product_bytes(const Case& k);
int64_t whole_product_bytes(const MlaConfig& c);  // the same from the shape alone

}  // namespace qkmla::ref
