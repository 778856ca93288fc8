#include "state_chain.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "errors.h"

namespace onnx_tts {

StateChain::StateChain(std::shared_ptr<Session> session, const std::string& mode,
                       const KVNames& pairs, const std::vector<KVValues>& initial)
    : session_(std::move(session)) {
  if (mode != "chain" && mode != "copy") {
    throw RunError(cat("state mode '", mode, "' is not one of: chain, copy"));
  }
  copy_ = mode == "copy";
  if (pairs.empty()) throw RunError(cat("no state tensors given for graph ", session_->path()));
  if (initial.size() != pairs.size()) {
    throw RunError(cat("one initial value per state pair is needed: ", pairs.size(),
                       " pairs, ", initial.size(), " values"));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto& [input, output] = pairs[i];
    const TensorSpec& in = session_->input_spec(input);
    const TensorSpec* out = session_->find_output(output);
    if (out == nullptr) {
      throw RunError(cat("state pair names output '", output, "', which graph ", session_->path(),
                         " does not have; its outputs are: ", session_->output_names()));
    }
    if (!seen.insert("in:" + input).second || !seen.insert("out:" + output).second) {
      throw RunError(cat("state pair ('", input, "', '", output, "') repeats a tensor of another pair"));
    }
    if (out->type != in.type) {
      throw RunError(cat("state input '", input, "' is ", dtype_name(in.type), " but output '",
                         output, "' is ", dtype_name(out->type)));
    }
    if (initial[i].type != in.type) {
      throw RunError(cat("initial value of '", input, "' is ", dtype_name(initial[i].type),
                         ", the graph expects ", dtype_name(in.type)));
    }
    session_->check_feed(in, initial[i].type, initial[i].shape);
    Slot slot{input, output, in.type, initial[i].shape, 0, nullptr, nullptr, {}};
    slot.bytes = static_cast<size_t>(element_count(slot.shape)) * element_type_of(in.type, input).size;
    slot.initial = std::make_shared<Ort::Value>(Ort::Value::CreateTensor(
        host_allocator_, slot.shape.data(), slot.shape.size(), slot.type));
    if (slot.bytes > 0) {
      std::memcpy(slot.initial->GetTensorMutableRawData(), initial[i].data, slot.bytes);
    }
    slot.current = slot.initial;
    state_inputs_.push_back(input);
    slots_.push_back(std::move(slot));
  }
  for (const auto& spec : session_->outputs()) {
    bool state = std::any_of(slots_.begin(), slots_.end(),
                             [&](const Slot& slot) { return slot.output == spec.name; });
    if (!state) other_outputs_.push_back(spec.name);
  }
}

KVNames StateChain::pair_names() const {
  KVNames names;
  for (const auto& slot : slots_) names.emplace_back(slot.input, slot.output);
  return names;
}

void StateChain::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& slot : slots_) {
    slot.current = slot.initial;
    slot.host.clear();
  }
  last_output_ptrs_.clear();
  steps_ = 0;
}

std::vector<NamedValue> StateChain::step(std::vector<Feed> feeds,
                                         const std::optional<std::vector<std::string>>& requested) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<std::string>& outputs = requested ? *requested : other_outputs_;
  session_->check_outputs_requested(outputs);
  for (const auto& name : outputs) {
    if (std::find(other_outputs_.begin(), other_outputs_.end(), name) == other_outputs_.end()) {
      throw RunError(cat("output '", name, "' is a state output the chain feeds back; do not "
                         "request it"));
    }
  }
  for (const auto& feed : feeds) {
    if (std::find(state_inputs_.begin(), state_inputs_.end(), feed.name) != state_inputs_.end()) {
      throw RunError(cat("input '", feed.name, "' is a state input held by the chain; do not feed it"));
    }
  }
  session_->check_all_inputs_fed(feeds, state_inputs_);

  // IO binding is stateful: every output is bound afresh each run.
  Ort::IoBinding binding(session_->ort());
  for (const auto& feed : feeds) binding.BindInput(feed.name.c_str(), *feed.value);
  for (const auto& slot : slots_) {
    binding.BindInput(slot.input.c_str(), *slot.current);
    binding.BindOutput(slot.output.c_str(), copy_ ? cpu_memory() : session_->kv_memory());
  }
  for (const auto& name : outputs) binding.BindOutput(name.c_str(), cpu_memory());
  session_->run_binding(binding);
  std::vector<Ort::Value> values = binding.GetOutputValues();
  if (values.size() != slots_.size() + outputs.size()) {
    throw RunError(cat("ONNX Runtime returned ", values.size(), " outputs, expected ",
                       slots_.size() + outputs.size()));
  }
  // Every state output is checked before any replaces its input: a failed step leaves the
  // chain as it was.
  for (size_t i = 0; i < slots_.size(); ++i) {
    auto info = values[i].GetTensorTypeAndShapeInfo();
    if (info.GetShape() != slots_[i].shape || info.GetElementType() != slots_[i].type) {
      throw RunError(cat("state output '", slots_[i].output, "' came back as ",
                         dtype_name(info.GetElementType()), " ", shape_string(info.GetShape()),
                         " but its input '", slots_[i].input, "' holds ",
                         dtype_name(slots_[i].type), " ", shape_string(slots_[i].shape),
                         "; the state must keep its size from step to step"));
    }
  }
  last_output_ptrs_.assign(slots_.size(), 0);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    last_output_ptrs_[i] = reinterpret_cast<uintptr_t>(values[i].GetTensorRawData());
    if (!copy_) {
      slot.current = std::make_shared<Ort::Value>(std::move(values[i]));
      continue;
    }
    slot.host.resize(slot.bytes);
    if (slot.bytes > 0) std::memcpy(slot.host.data(), values[i].GetTensorRawData(), slot.bytes);
    slot.current = std::make_shared<Ort::Value>(Ort::Value::CreateTensor(
        cpu_memory(), slot.host.data(), slot.bytes, slot.shape.data(), slot.shape.size(), slot.type));
  }
  std::vector<NamedValue> result = named_values(values, slots_.size(), outputs);
  steps_ += 1;
  return result;
}

std::vector<uintptr_t> StateChain::state_ptrs() const {
  std::vector<uintptr_t> ptrs;
  for (const auto& slot : slots_) {
    ptrs.push_back(reinterpret_cast<uintptr_t>(slot.current->GetTensorRawData()));
  }
  return ptrs;
}

}  // namespace onnx_tts
