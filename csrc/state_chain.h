// A graph's recurrent state chained from run to run: each state output becomes the next run's
// state input (a streaming codec's position offsets and sliding attention caches). The state
// has a fixed size: every output must come back with its input's shape and dtype.
//   chain  the output OrtValue is bound as the next input, no copy;
//   copy   the output is fetched to host memory and fed back (the published scripts' way).
// reset() returns to the initial values given at construction (kept once, never copied again).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kv_pairs.h"
#include "session.h"

namespace onnx_tts {

class StateChain {
 public:
  // `pairs`: (state input, state output) names; `initial`: one host value per pair, of the
  // input's dtype and a shape its declared dimensions accept.
  StateChain(std::shared_ptr<Session> session, const std::string& mode, const KVNames& pairs,
             const std::vector<KVValues>& initial);

  std::string mode() const { return copy_ ? "copy" : "chain"; }
  int64_t steps() const { return steps_; }
  KVNames pair_names() const;

  void reset();
  // Runs the graph over the non-state `feeds` and the current state, then makes the state
  // outputs the next state. Returns the requested non-state outputs (all by default).
  std::vector<NamedValue> step(std::vector<Feed> feeds,
                               const std::optional<std::vector<std::string>>& requested);

  // Data pointers of the current state inputs, and of the last run's state outputs.
  std::vector<uintptr_t> state_ptrs() const;
  std::vector<uintptr_t> output_ptrs() const { return last_output_ptrs_; }

 private:
  struct Slot {
    std::string input, output;
    ONNXTensorElementDataType type;
    std::vector<int64_t> shape;
    size_t bytes;
    std::shared_ptr<Ort::Value> initial;
    std::shared_ptr<Ort::Value> current;
    std::vector<uint8_t> host;  // copy mode: the fed-back bytes
  };

  std::shared_ptr<Session> session_;
  bool copy_;
  std::vector<Slot> slots_;
  std::vector<std::string> state_inputs_;
  std::vector<std::string> other_outputs_;
  Ort::AllocatorWithDefaultOptions host_allocator_;
  std::vector<uintptr_t> last_output_ptrs_;
  int64_t steps_ = 0;
  std::mutex mutex_;
};

}  // namespace onnx_tts
