// How an LM's KV cache moves from one step to the next, chosen once when a KVCache is built
// (as onnxruntime-genai picks a KeyValueCache variant from config and graph I/O):
//   CopyKV     presents fetched to host arrays and fed back as pasts (the published-script
//              baseline, kept for A/B);
//   ChainKV    each present OrtValue becomes the next past, no copy (graphs that Concat);
//   InPlaceKV  one fixed-capacity buffer per pair bound as both past and present (graphs whose
//              attention writes the cache in place, e.g. GroupQueryAttention).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kv_pairs.h"
#include "session.h"

namespace onnx_tts {

class KVStrategy {
 public:
  KVStrategy(Session& session, const std::vector<KVPair>& pairs, int64_t batch);
  virtual ~KVStrategy() = default;
  KVStrategy(const KVStrategy&) = delete;
  KVStrategy& operator=(const KVStrategy&) = delete;

  virtual const char* name() const = 0;
  // Empties the cache.
  virtual void clear() = 0;
  // Whether the KV bindings stay valid from step to step (then the step's other inputs and
  // outputs can stay bound too).
  virtual bool static_binding() const { return false; }
  // Binds pair i's past input and present output for the next run.
  virtual void bind(Ort::IoBinding& binding, size_t i) = 0;
  // Takes pair i's present output after a run that left `total` tokens cached.
  virtual void accept(size_t i, Ort::Value&& present, int64_t total) = 0;
  // Takes the present of another graph (a prefill graph without pasts) as pair i's cache of
  // `total` tokens, laid out with its sequence on `source_axis` (1 or 2); the cache was cleared
  // before. Chain keeps the value, copy fetches it to the host, in place copies it into the
  // buffer; a present laid out differently from the pair is transposed on the way (once).
  virtual void adopt(size_t i, Ort::Value&& present, int64_t total, int source_axis);
  // Makes pair i's cache hold `length` tokens copied from host memory [batch, heads, length,
  // head_dim] (a cached prefix); the cache was cleared before.
  virtual void load(size_t i, const void* src, int64_t length);

  const Ort::Value& past(size_t i) const { return *past_[i]; }

 protected:
  // RunError unless `present` is [batch, heads, total, head_dim] (what a Concat graph returns).
  void check_grown(size_t i, const Ort::Value& present, int64_t total) const;
  // RunError unless `present` holds `total` tokens of pair i laid out with `source_axis`.
  void check_adopted(size_t i, const Ort::Value& present, int64_t total, int source_axis) const;
  // `src` (host, [batch, total, heads, head_dim] or [batch, heads, total, head_dim]) written as
  // the first `total` tokens of each row of `dst`, whose sequence axis is the pair's.
  void write_transposed(size_t i, const Ort::Value& src, int64_t total, Ort::Value& dst) const;
  std::vector<int64_t> shape_with(size_t i, int64_t tokens) const;
  OrtAllocator* kv_allocator();

  Session& session_;
  const std::vector<KVPair>& pairs_;
  int64_t batch_;

 private:
  // Declared before past_ so it is destroyed after it: tensors free through their allocator.
  std::unique_ptr<Ort::Allocator> allocator_;

 protected:
  std::vector<std::shared_ptr<Ort::Value>> past_;
};

// "copy", "chain" or "inplace" (which needs a capacity); RunError for anything else.
std::unique_ptr<KVStrategy> make_kv_strategy(const std::string& mode, Session& session,
                                             const std::vector<KVPair>& pairs, int64_t batch,
                                             std::optional<int64_t> capacity);

}  // namespace onnx_tts
