// The (past input, present output) pairs of an LM graph, as the caller names them (Python
// pairs them by parsed layer index in onnx_tts.graph_io.kv_pairs), checked against the graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "session.h"

namespace onnx_tts {

struct KVPair {
  std::string past;     // input name
  std::string present;  // output name
  ONNXTensorElementDataType type;
  int64_t heads;
  int64_t head_dim;
  size_t element_size;
  // Axis of the sequence: 2 for [batch, heads, sequence, head_dim] (Hugging Face, GQA), 1 for
  // [batch, sequence, heads, head_dim] (some published exports' Concat graphs).
  int seq_axis = 2;

  // The shape of `tokens` cached tokens of `batch` rows in this pair's layout.
  std::vector<int64_t> shape(int64_t batch, int64_t tokens) const;
  // "[batch, heads, sequence, head_dim]" or "[batch, sequence, heads, head_dim]".
  const char* layout() const;
};

using KVNames = std::vector<std::pair<std::string, std::string>>;

// Checks each pair: both tensors exist, rank 4 [batch, heads, sequence, head_dim] or [batch,
// sequence, heads, head_dim] (the symbolic one of axes 1 and 2 is the sequence) with fixed and
// equal heads and head_dim, one dtype; no tensor in two pairs.
std::vector<KVPair> resolve_kv_pairs(const Session& session, const KVNames& names);

// Largest KV allocation the core makes for one cache (all pairs, all rows).
constexpr int64_t kMaxKVBytes = int64_t{16} << 30;

// Bytes of fixed KV buffers [rows, heads, capacity, head_dim] for every pair; RunError naming
// the number when it exceeds kMaxKVBytes.
int64_t checked_kv_bytes(const std::vector<KVPair>& pairs, int64_t rows, int64_t capacity);

// Checks values to load into a cache of `batch` rows: one per pair, each of the pair's shape
// for L tokens and dtype with one L, 1 <= L <= capacity (when given). Returns L.
int64_t checked_prefix_length(const std::vector<KVPair>& pairs, const std::vector<KVValues>& values,
                              int64_t batch, std::optional<int64_t> capacity);

// The token count a step adds: dimension 1 of `inputs_embeds` or `input_ids`.
int64_t new_tokens_of(const std::vector<Feed>& feeds);

// GroupQueryAttention's length inputs, filled by the core so a caller cannot make the kernel
// read or write past the KV buffers: seqlens_k int32 [batch] (each row's total length - 1) and
// total_sequence_length int32 scalar (the longest total in the batch).
class LengthInputs {
 public:
  explicit LengthInputs(const Session& session);
  bool any() const { return seqlens_ || total_; }
  // For each length input the graph declares: a caller's feed must hold exactly the values the
  // cache derives from `totals` (RunError otherwise); a missing one is added, over storage this
  // object owns until the next call.
  void fill(const Session& session, const std::vector<int64_t>& totals, std::vector<Feed>& feeds);

 private:
  bool seqlens_ = false;
  bool total_ = false;
  std::vector<int32_t> seqlens_values_;
  int32_t total_value_ = 0;
};

}  // namespace onnx_tts
