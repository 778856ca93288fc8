// The KV cache of one LM session: one sequence batch, a KVStrategy (copy / chain / in place),
// and a step that binds, runs and hands the presents to the strategy.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv_pairs.h"
#include "kv_strategy.h"
#include "session.h"

namespace onnx_tts {

struct KVStats {
  int64_t steps = 0;
  int64_t run_ns = 0;   // inside ONNX Runtime
  int64_t step_ns = 0;  // the whole step, binding and checks included
};

class KVCache {
 public:
  KVCache(std::shared_ptr<Session> session, const std::string& mode, int64_t batch_size,
          std::optional<int64_t> capacity, const KVNames& pairs);

  int64_t length() const { return length_; }
  std::optional<int64_t> capacity() const { return capacity_; }
  std::string mode() const { return strategy_->name(); }
  int64_t batch_size() const { return batch_; }
  KVNames pair_names() const;

  // Runs one step over the non-KV `feeds` and returns the requested non-KV outputs (all of
  // them by default). GroupQueryAttention length inputs are filled in when not fed.
  std::vector<NamedValue> step(std::vector<Feed> feeds, std::optional<int64_t> new_tokens,
                               const std::optional<std::vector<std::string>>& requested);
  void reset();
  // Empties the cache, runs `source` (a prefill graph: it has the pairs' present outputs and no
  // past inputs) over `feeds` and keeps its presents as the cache's first tokens, handed over by
  // the strategy (chain: the OrtValues themselves, no copy). Returns the requested other outputs
  // of `source` (all of them by default).
  std::vector<NamedValue> prefill(Session& source, std::vector<Feed> feeds,
                                  const std::optional<std::vector<std::string>>& requested);
  // Empties the cache, then fills it with `values` (one per pair, [batch, heads, L, head_dim]):
  // the next step continues after those L tokens as if they had been run.
  void load_prefix(const std::vector<KVValues>& values);

  std::vector<uintptr_t> past_ptrs() const;
  std::vector<uintptr_t> present_ptrs() const { return last_present_ptrs_; }
  KVStats stats() const { return stats_; }
  void reset_stats() { stats_ = KVStats{}; }

  // One KV tensor's cached part: shape [batch, heads, length, head_dim], copied into `dst`.
  std::vector<int64_t> read_shape(size_t index) const;
  void read(size_t index, void* dst) const;

 private:
  struct StagedInput {
    std::shared_ptr<Ort::Value> value;  // owned host tensor, bound once
    std::vector<int64_t> shape;
    ONNXTensorElementDataType type;
  };

  void check_request(const std::vector<Feed>& feeds, const std::vector<std::string>& outputs) const;
  void bind(const std::vector<Feed>& feeds, const std::vector<std::string>& outputs, int64_t added);
  void bind_layout(const std::vector<std::string>& outputs);
  void stage_input(const Feed& feed);
  void run();
  std::vector<NamedValue> collect(const std::vector<std::string>& outputs, int64_t added,
                                  int64_t total);
  void forget_binding();

  std::shared_ptr<Session> session_;
  int64_t batch_;
  std::optional<int64_t> capacity_;
  std::vector<KVPair> pairs_;  // before strategy_, which refers to it
  std::unique_ptr<KVStrategy> strategy_;
  Ort::IoBinding binding_;
  Ort::AllocatorWithDefaultOptions host_allocator_;
  LengthInputs length_inputs_;
  std::vector<std::string> past_names_;
  std::unordered_set<std::string> past_set_, present_set_;
  std::vector<std::string> other_outputs_;
  std::mutex mutex_;

  // The current binding: KV pairs first, then `bound_outputs_` in order.
  bool layout_valid_ = false;
  std::vector<std::string> bound_outputs_;
  std::unordered_map<std::string, StagedInput> staged_inputs_;  // static binding: bound inputs
  // Static binding: the outputs of the last step, reused by a step adding as many tokens.
  std::vector<std::shared_ptr<Ort::Value>> fixed_outputs_;
  int64_t fixed_tokens_ = 0;
  bool outputs_on_fixed_ = false;
  bool reuse_outputs_ = false;

  std::vector<uintptr_t> last_present_ptrs_;
  int64_t length_ = 0;
  KVStats stats_;
};

}  // namespace onnx_tts
