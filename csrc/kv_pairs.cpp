#include "kv_pairs.h"

#include <algorithm>
#include <limits>
#include <set>

#include "errors.h"

namespace onnx_tts {

std::vector<int64_t> KVPair::shape(int64_t batch, int64_t tokens) const {
  if (seq_axis == 1) return {batch, tokens, heads, head_dim};
  return {batch, heads, tokens, head_dim};
}

const char* KVPair::layout() const {
  return seq_axis == 1 ? "[batch, sequence, heads, head_dim]" : "[batch, heads, sequence, head_dim]";
}

std::vector<KVPair> resolve_kv_pairs(const Session& session, const KVNames& names) {
  if (names.empty()) {
    throw RunError(cat("no KV inputs given for graph ", session.path(),
                       "; pass (past input, present output) pairs"));
  }
  std::vector<KVPair> pairs;
  std::set<std::string> seen;
  for (const auto& [past, present] : names) {
    const TensorSpec* in = session.find_input(past);
    if (in == nullptr) {
      throw RunError(cat("KV pair names input '", past, "', which graph ", session.path(),
                         " does not have; its inputs are: ", session.input_names()));
    }
    const TensorSpec* out = session.find_output(present);
    if (out == nullptr) {
      throw RunError(cat("KV pair names output '", present, "', which graph ", session.path(),
                         " does not have; its outputs are: ", session.output_names()));
    }
    if (!seen.insert("in:" + past).second || !seen.insert("out:" + present).second) {
      throw RunError(cat("KV pair ('", past, "', '", present, "') repeats a tensor of another pair"));
    }
    if (in->shape.size() != 4) {
      throw RunError(cat("KV input '", past, "' has rank ", in->shape.size(),
                         "; expected [batch, heads, sequence, head_dim] or [batch, sequence, "
                         "heads, head_dim]"));
    }
    // The sequence is the symbolic one of axes 1 and 2 (axis 2 when both are fixed).
    int seq_axis = in->shape[1] < 0 && in->shape[2] >= 0 ? 1 : 2;
    int heads_axis = 3 - seq_axis;
    if (in->shape[heads_axis] < 0 || in->shape[3] < 0) {
      throw RunError(cat("KV input '", past, "' has symbolic heads or head_dim (", spec_string(*in),
                         "); the cache needs them fixed"));
    }
    if (out->type != in->type) {
      throw RunError(cat("KV input '", past, "' is ", dtype_name(in->type), " but output '",
                         present, "' is ", dtype_name(out->type)));
    }
    bool same_heads = out->shape.size() == 4 &&
                      (out->shape[heads_axis] < 0 || out->shape[heads_axis] == in->shape[heads_axis]) &&
                      (out->shape[3] < 0 || out->shape[3] == in->shape[3]);
    if (!same_heads) {
      throw RunError(cat("KV output '", present, "' has shape ", spec_string(*out), " but input '",
                         past, "' has ", spec_string(*in), "; a pair must agree on heads and head_dim"));
    }
    if (!pairs.empty() && pairs[0].seq_axis != seq_axis) {
      throw RunError(cat("KV input '", past, "' is laid out ", seq_axis == 1 ? "[batch, sequence, "
                         "heads, head_dim]" : "[batch, heads, sequence, head_dim]", " but '",
                         pairs[0].past, "' is ", pairs[0].layout(), "; all pairs need one layout"));
    }
    pairs.push_back(KVPair{past, present, in->type, in->shape[heads_axis], in->shape[3],
                           element_type_of(in->type, past).size, seq_axis});
  }
  return pairs;
}

int64_t checked_kv_bytes(const std::vector<KVPair>& pairs, int64_t rows, int64_t capacity) {
  // In long double so that absurd sizes are refused instead of overflowing.
  long double total = 0;
  for (const auto& pair : pairs) {
    total += static_cast<long double>(rows) * pair.heads * capacity * pair.head_dim *
             static_cast<long double>(pair.element_size);
  }
  if (total > static_cast<long double>(kMaxKVBytes)) {
    throw RunError(cat("KV buffers for ", rows, " row(s) x capacity ", capacity, " would take ",
                       static_cast<double>(total / (1024.0L * 1024.0L * 1024.0L)),
                       " GiB; the limit is ", kMaxKVBytes >> 30,
                       " GiB: lower the capacity or the number of rows"));
  }
  return static_cast<int64_t>(total);
}

int64_t checked_prefix_length(const std::vector<KVPair>& pairs, const std::vector<KVValues>& values,
                              int64_t batch, std::optional<int64_t> capacity) {
  if (values.size() != pairs.size()) {
    throw RunError(cat("a KV prefix needs one array per KV pair (", pairs.size(), "), got ",
                       values.size()));
  }
  int64_t length = values.empty() || values[0].shape.size() != 4 || pairs.empty()
                       ? -1
                       : values[0].shape[pairs[0].seq_axis];
  for (size_t i = 0; i < pairs.size(); ++i) {
    const KVPair& pair = pairs[i];
    std::vector<int64_t> expected = pair.shape(batch, length);
    if (values[i].shape != expected || length < 1) {
      throw RunError(cat("KV prefix array ", i, " ('", pair.past, "') has shape ",
                         shape_string(values[i].shape), ", expected ", shape_string(expected),
                         " ", pair.layout(), " with a length >= 1, one for every pair"));
    }
    if (values[i].type != pair.type) {
      throw RunError(cat("KV prefix array ", i, " ('", pair.past, "') is ",
                         dtype_name(values[i].type), ", the cache holds ", dtype_name(pair.type)));
    }
  }
  if (capacity && length > *capacity) {
    throw RunError(cat("a KV prefix of ", length, " tokens does not fit the capacity of ",
                       *capacity, " tokens"));
  }
  return length;
}

int64_t new_tokens_of(const std::vector<Feed>& feeds) {
  for (const char* name : {"inputs_embeds", "input_ids"}) {
    for (const auto& feed : feeds) {
      if (feed.name == name && feed.shape.size() >= 2) return feed.shape[1];
    }
  }
  throw RunError("cannot tell how many tokens this step adds: feed 'inputs_embeds' or "
                 "'input_ids' with shape [batch, tokens, ...], or pass new_tokens=");
}

LengthInputs::LengthInputs(const Session& session)
    : seqlens_(session.find_input("seqlens_k") != nullptr),
      total_(session.find_input("total_sequence_length") != nullptr) {}

namespace {

// Checks a caller's feed of a length input against what the cache expects.
bool check_fed_lengths(const std::vector<Feed>& feeds, const char* name,
                       const std::vector<int32_t>& expected) {
  for (const auto& feed : feeds) {
    if (feed.name != name) continue;
    const auto* data = static_cast<const int32_t*>(feed.value->GetTensorRawData());
    size_t count = feed.value->GetTensorTypeAndShapeInfo().GetElementCount();
    if (count != expected.size()) {
      throw RunError(cat("input '", name, "' has ", count, " values but the cache expects ",
                         expected.size(), "; leave it out and the cache fills it"));
    }
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != expected[i]) {
        throw RunError(cat("input '", name, "' is ", data[i], " but the cache expects ",
                           expected[i], "; leave it out and the cache fills it"));
      }
    }
    return true;
  }
  return false;
}

}  // namespace

void LengthInputs::fill(const Session& session, const std::vector<int64_t>& totals,
                        std::vector<Feed>& feeds) {
  if (!any()) return;
  int64_t longest = 0;
  seqlens_values_.resize(totals.size());
  for (size_t i = 0; i < totals.size(); ++i) {
    if (totals[i] > std::numeric_limits<int32_t>::max()) {
      throw RunError(cat("a sequence of ", totals[i], " tokens does not fit GroupQueryAttention's "
                         "int32 lengths"));
    }
    seqlens_values_[i] = static_cast<int32_t>(totals[i] - 1);
    longest = std::max(longest, totals[i]);
  }
  total_value_ = static_cast<int32_t>(longest);
  if (seqlens_ && !check_fed_lengths(feeds, "seqlens_k", seqlens_values_)) {
    std::vector<int64_t> shape{static_cast<int64_t>(seqlens_values_.size())};
    feeds.push_back(session.make_feed(
        "seqlens_k", std::make_shared<Ort::Value>(Ort::Value::CreateTensor<int32_t>(
                         cpu_memory(), seqlens_values_.data(), seqlens_values_.size(),
                         shape.data(), shape.size()))));
  }
  if (total_ && !check_fed_lengths(feeds, "total_sequence_length", {total_value_})) {
    feeds.push_back(session.make_feed(
        "total_sequence_length",
        std::make_shared<Ort::Value>(
            Ort::Value::CreateTensor<int32_t>(cpu_memory(), &total_value_, 1, nullptr, 0))));
  }
}

}  // namespace onnx_tts
