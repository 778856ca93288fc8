// One ONNX graph on ONNX Runtime: options, introspection, feed checks, IO-binding runs.
// std types only; the Python edge (bindings.cpp, numpy_convert.h) converts.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ort.h"
#include "tensor.h"

namespace onnx_tts {

struct SessionConfig {
  std::vector<std::string> providers{"CPUExecutionProvider"};
  int intra_op_threads = 0;
  int inter_op_threads = 0;
  std::string optimization = "all";
  bool shared_thread_pool = false;
  bool allow_spinning = true;
  int device_id = 0;
};

class Session {
 public:
  Session(const std::string& path, const SessionConfig& config);

  const std::string& path() const { return path_; }
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  Ort::Session& ort() { return *session_; }
  // Where KV and other device-resident values live: the CUDA device or host memory.
  const OrtMemoryInfo* kv_memory() const;
  bool on_device() const { return device_memory_ != nullptr; }
  // What KV buffers are allocated with. On the CPU the default allocator: the session's arena
  // keeps every byte it ever held, so a buffer let go (a grown slot buffer replaced, an idle
  // one released, a cache dropped) would stay with the process; the default one gives it back.
  // On a device the session's allocator, made into `holder`, which must outlive the buffers.
  OrtAllocator* kv_allocator(std::unique_ptr<Ort::Allocator>& holder);

  const TensorSpec* find_input(const std::string& name) const;
  const TensorSpec* find_output(const std::string& name) const;
  // The declared input `name`; RunError listing the graph's inputs when there is none.
  const TensorSpec& input_spec(const std::string& name) const;
  std::string input_names() const;
  std::string output_names() const;
  std::vector<std::string> all_output_names() const;

  // Checks a value against the declared input `name` and makes it a feed.
  Feed make_feed(const std::string& name, std::shared_ptr<Ort::Value> value) const;
  void check_feed(const TensorSpec& spec, ONNXTensorElementDataType type,
                  const std::vector<int64_t>& shape) const;
  void check_outputs_requested(const std::vector<std::string>& names) const;
  // Every declared input appears among `feeds` (plus `also_fed`, e.g. KV inputs a cache binds).
  void check_all_inputs_fed(const std::vector<Feed>& feeds,
                            const std::vector<std::string>& also_fed = {}) const;

  // A plain run: outputs (all unless named) in host memory, or where KV lives with keep_values.
  std::vector<NamedValue> run(const std::vector<Feed>& feeds,
                              const std::optional<std::vector<std::string>>& requested,
                              bool keep_values);
  // Runs a prepared binding; an ORT failure becomes a RunError naming the graph.
  void run_binding(Ort::IoBinding& binding);

 private:
  std::string path_;
  std::unique_ptr<Ort::Session> session_;
  std::unique_ptr<Ort::MemoryInfo> device_memory_;
  Ort::RunOptions run_options_;
  std::vector<TensorSpec> inputs_;
  std::vector<TensorSpec> outputs_;
};

// The ORT values a binding returns, with their names, in binding order.
std::vector<NamedValue> bound_outputs(Ort::IoBinding& binding);

}  // namespace onnx_tts
