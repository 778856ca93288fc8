// In-place KV slot buffers for batched decoding across requests: one [rows, heads, capacity,
// head_dim] buffer per (past, present) pair, allocated once. A step runs the LM over a row
// range [first_row, first_row + count), bound as contiguous sub-buffers of those buffers (the
// batch axis is outermost), so nothing is copied when rows join or leave. Each row keeps its
// own length: GroupQueryAttention graphs get per-row seqlens_k from the core; an attention_mask
// (the lengths of graphs that derive them inside, positions for others) is the caller's, and
// is checked against the lengths.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "kv_cache.h"
#include "kv_pairs.h"
#include "session.h"

namespace onnx_tts {

class KVSlots {
 public:
  static constexpr int64_t kMaxRows = 1024;

  KVSlots(std::shared_ptr<Session> session, int64_t rows, int64_t capacity, const KVNames& pairs);

  // A second binding over these same buffers: the twin steps a row range while this one steps
  // another, disjoint range on another thread (each range's LM run on its own core). The
  // buffers must outlive the twin (the bindings keep the original alive).
  std::unique_ptr<KVSlots> twin() const;

  int64_t rows() const { return rows_; }
  int64_t capacity() const { return capacity_; }
  KVNames pair_names() const;
  // Bytes between row r and row r + 1 of pair `index`'s buffer.
  int64_t row_stride(size_t index) const;

  // Runs the LM over rows [first_row, first_row + lengths.size()); row i holds lengths[i]
  // cached tokens and the feeds (batch = lengths.size()) add the same number of new tokens to
  // every row. Returns the requested non-KV outputs (all by default).
  std::vector<NamedValue> step(std::vector<Feed> feeds, int64_t first_row,
                               const std::vector<int64_t>& lengths,
                               const std::optional<std::vector<std::string>>& requested);

  // Start of rows [first_row, ...) in each pair's buffer (the past bound for those rows).
  std::vector<uintptr_t> past_ptrs(int64_t first_row, int64_t count) const;
  // Where ONNX Runtime wrote each present for those rows in the last step (they must have
  // been among its rows).
  std::vector<uintptr_t> present_ptrs(int64_t first_row, int64_t count) const;
  KVStats stats() const { return stats_; }

  // Writes `values` (one per pair, [1, heads, L, head_dim]) as row `row`'s first L tokens: a
  // step with lengths[row] = L then continues after them.
  void load_prefix(int64_t row, const std::vector<KVValues>& values);

  // Row `row`'s first `length` cached tokens of pair `index`: [1, heads, length, head_dim].
  std::vector<int64_t> read_shape(size_t index, int64_t row, int64_t length) const;
  void read(size_t index, int64_t row, int64_t length, void* dst) const;

 private:
  struct TwinOf {
    const KVSlots& original;
  };
  explicit KVSlots(TwinOf of);

  void check_rows(int64_t first_row, int64_t count) const;
  int64_t check_feeds(const std::vector<Feed>& feeds, int64_t count) const;
  void check_lengths(const std::vector<int64_t>& lengths, int64_t added) const;
  void check_mask(const std::vector<Feed>& feeds, const std::vector<int64_t>& totals) const;
  void bind_rows(int64_t first_row, int64_t count, const std::vector<std::string>& outputs);
  uint8_t* row_start(size_t index, int64_t row) const;

  std::shared_ptr<Session> session_;
  int64_t rows_;
  int64_t capacity_;
  std::vector<KVPair> pairs_;
  // Declared before buffers_ so it is destroyed after them: tensors free through it.
  std::unique_ptr<Ort::Allocator> allocator_;
  std::vector<std::shared_ptr<Ort::Value>> buffers_;
  Ort::IoBinding binding_;
  LengthInputs length_inputs_;
  bool attention_mask_ = false;
  std::vector<std::string> past_names_;
  std::unordered_set<std::string> past_set_, present_set_;
  std::vector<std::string> other_outputs_;
  std::mutex mutex_;

  // The current binding: views of rows [bound_first_, bound_first_ + bound_count_) as every
  // past and present, then `bound_outputs_`.
  std::vector<Ort::Value> views_;
  int64_t bound_first_ = -1;
  int64_t bound_count_ = 0;
  std::vector<std::string> bound_outputs_;
  std::vector<uintptr_t> last_present_ptrs_;
  int64_t last_first_ = -1;
  int64_t last_count_ = 0;
  KVStats stats_;
};

}  // namespace onnx_tts
