#include "kv_cache.h"

#include <chrono>
#include <cstring>

#include "errors.h"

namespace onnx_tts {
namespace {
using Clock = std::chrono::steady_clock;

int64_t nanoseconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}
}  // namespace

KVCache::KVCache(std::shared_ptr<Session> session, const std::string& mode, int64_t batch_size,
                 std::optional<int64_t> capacity, const KVNames& pairs)
    : session_(std::move(session)), batch_(batch_size), capacity_(capacity),
      binding_(session_->ort()), length_inputs_(*session_) {
  if (batch_ < 1) throw RunError(cat("batch_size must be >= 1, got ", batch_));
  if (capacity_ && *capacity_ < 1) throw RunError(cat("capacity must be >= 1, got ", *capacity_));
  pairs_ = resolve_kv_pairs(*session_, pairs);
  if (mode == "inplace" && capacity_) checked_kv_bytes(pairs_, batch_, *capacity_);
  strategy_ = make_kv_strategy(mode, *session_, pairs_, batch_, capacity_);
  for (const auto& pair : pairs_) {
    past_names_.push_back(pair.past);
    past_set_.insert(pair.past);
    present_set_.insert(pair.present);
  }
  for (const auto& spec : session_->outputs()) {
    if (present_set_.count(spec.name) == 0) other_outputs_.push_back(spec.name);
  }
}

KVNames KVCache::pair_names() const {
  KVNames names;
  for (const auto& pair : pairs_) names.emplace_back(pair.past, pair.present);
  return names;
}

void KVCache::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  length_ = 0;
  last_present_ptrs_.clear();
  forget_binding();  // an idle cache holds no chained values through the binding
  strategy_->clear();
}

std::vector<NamedValue> KVCache::prefill(Session& source, std::vector<Feed> feeds,
                                         const std::optional<std::vector<std::string>>& requested) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto step_start = Clock::now();
  for (const auto& pair : pairs_) {
    const TensorSpec* out = source.find_output(pair.present);
    if (out == nullptr) {
      throw RunError(cat("prefill graph ", source.path(), " has no output '", pair.present,
                         "' (the KV output of ", session_->path(), "); its outputs are: ",
                         source.output_names()));
    }
    if (out->type != pair.type) {
      throw RunError(cat("prefill output '", pair.present, "' is ", dtype_name(out->type),
                         " but the cache holds ", dtype_name(pair.type)));
    }
  }
  std::vector<std::string> outputs;
  if (requested) {
    outputs = *requested;
  } else {
    for (const auto& spec : source.outputs()) {
      if (present_set_.count(spec.name) == 0) outputs.push_back(spec.name);
    }
  }
  source.check_outputs_requested(outputs);
  for (const auto& name : outputs) {
    if (present_set_.count(name)) {
      throw RunError(cat("output '", name, "' is a KV output the cache takes; read it with "
                         "KVCache.read()"));
    }
  }
  source.check_all_inputs_fed(feeds);
  length_ = 0;
  last_present_ptrs_.clear();
  forget_binding();
  strategy_->clear();

  Ort::IoBinding binding(source.ort());
  for (const auto& feed : feeds) binding.BindInput(feed.name.c_str(), *feed.value);
  for (const auto& pair : pairs_) binding.BindOutput(pair.present.c_str(), source.kv_memory());
  for (const auto& name : outputs) binding.BindOutput(name.c_str(), cpu_memory());
  auto run_start = Clock::now();
  source.run_binding(binding);
  auto run_end = Clock::now();
  std::vector<Ort::Value> values = binding.GetOutputValues();
  if (values.size() != pairs_.size() + outputs.size()) {
    throw RunError(cat("ONNX Runtime returned ", values.size(), " outputs, expected ",
                       pairs_.size() + outputs.size()));
  }
  // The prefill graph may lay its KV out differently from the step graph (a published prefill
  // may be [B, S, H, D] and its converted in-place step graph [B, H, S, D]): read its layout
  // from its declared output, as the step graph's is read from its inputs.
  const TensorSpec* declared = source.find_output(pairs_[0].present);
  int source_axis = declared->shape.size() == 4 && declared->shape[1] < 0 && declared->shape[2] >= 0
                        ? 1
                        : 2;
  std::vector<int64_t> first = values[0].GetTensorTypeAndShapeInfo().GetShape();
  int64_t total = first.size() == 4 ? first[static_cast<size_t>(source_axis)] : -1;
  if (total < 1 || (capacity_ && total > *capacity_)) {
    throw RunError(cat("prefill output '", pairs_[0].present, "' has shape ", shape_string(first),
                       capacity_ ? cat("; the cache holds 1 to ", *capacity_, " tokens")
                                 : std::string("; expected at least one token")));
  }
  try {
    last_present_ptrs_.assign(pairs_.size(), 0);
    for (size_t i = 0; i < pairs_.size(); ++i) {
      last_present_ptrs_[i] = reinterpret_cast<uintptr_t>(values[i].GetTensorRawData());
      strategy_->adopt(i, std::move(values[i]), total, source_axis);
    }
  } catch (...) {
    last_present_ptrs_.clear();
    strategy_->clear();
    throw;
  }
  length_ = total;
  std::vector<NamedValue> result = named_values(values, pairs_.size(), outputs);
  stats_.steps += 1;
  stats_.run_ns += nanoseconds(run_start, run_end);
  stats_.step_ns += nanoseconds(step_start, Clock::now());
  return result;
}

void KVCache::load_prefix(const std::vector<KVValues>& values) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (session_->on_device()) throw RunError("loading a KV prefix on a device is not supported");
  int64_t length = checked_prefix_length(pairs_, values, batch_, capacity_);
  length_ = 0;
  last_present_ptrs_.clear();
  forget_binding();
  strategy_->clear();
  for (size_t i = 0; i < pairs_.size(); ++i) strategy_->load(i, values[i].data, length);
  length_ = length;
}

void KVCache::forget_binding() {
  binding_.ClearBoundInputs();
  binding_.ClearBoundOutputs();
  layout_valid_ = false;
  bound_outputs_.clear();
  staged_inputs_.clear();
  fixed_outputs_.clear();
  fixed_tokens_ = 0;
  outputs_on_fixed_ = false;
}

std::vector<NamedValue> KVCache::step(std::vector<Feed> feeds, std::optional<int64_t> new_tokens,
                                      const std::optional<std::vector<std::string>>& requested) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto step_start = Clock::now();
  const std::vector<std::string>& outputs = requested ? *requested : other_outputs_;
  check_request(feeds, outputs);
  int64_t added = new_tokens ? *new_tokens : new_tokens_of(feeds);
  if (added < 1) throw RunError(cat("a step must add at least one token, got ", added));
  int64_t total = length_ + added;
  if (capacity_ && total > *capacity_) {
    throw RunError(cat("KV capacity exceeded: the cache holds ", length_, " tokens, this step adds ",
                       added, ", capacity is ", *capacity_,
                       "; create the KVCache with a larger capacity"));
  }
  length_inputs_.fill(*session_, std::vector<int64_t>(static_cast<size_t>(batch_), total), feeds);
  session_->check_all_inputs_fed(feeds, past_names_);

  bind(feeds, outputs, added);
  auto run_start = Clock::now();
  run();
  auto run_end = Clock::now();
  std::vector<NamedValue> result = collect(outputs, added, total);
  length_ = total;
  stats_.steps += 1;
  stats_.run_ns += nanoseconds(run_start, run_end);
  stats_.step_ns += nanoseconds(step_start, Clock::now());
  return result;
}

void KVCache::check_request(const std::vector<Feed>& feeds,
                            const std::vector<std::string>& outputs) const {
  for (const auto& feed : feeds) {
    if (past_set_.count(feed.name)) {
      throw RunError(cat("input '", feed.name, "' is a KV input managed by the cache; do not feed it"));
    }
  }
  if (layout_valid_ && outputs == bound_outputs_) return;  // checked when first bound
  session_->check_outputs_requested(outputs);
  for (const auto& name : outputs) {
    if (present_set_.count(name)) {
      throw RunError(cat("output '", name, "' is a KV output managed by the cache; read it with "
                         "KVCache.read()"));
    }
  }
}

void KVCache::bind(const std::vector<Feed>& feeds, const std::vector<std::string>& outputs,
                   int64_t added) {
  bool fresh = !layout_valid_ || outputs != bound_outputs_;
  if (fresh) {
    bind_layout(outputs);
  } else if (!strategy_->static_binding()) {
    for (size_t i = 0; i < pairs_.size(); ++i) strategy_->bind(binding_, i);
  }
  // With static KV bindings, a step adding as many tokens as the last one writes its outputs
  // into the last step's output tensors, so a steady decode step binds nothing at all.
  reuse_outputs_ = strategy_->static_binding() && fixed_tokens_ == added &&
                   fixed_outputs_.size() == outputs.size() && !outputs.empty();
  if (reuse_outputs_) {
    if (!outputs_on_fixed_) {
      for (size_t i = 0; i < outputs.size(); ++i) {
        binding_.BindOutput(outputs[i].c_str(), *fixed_outputs_[i]);
      }
      outputs_on_fixed_ = true;
    }
  } else if (!fresh) {
    // IO binding is stateful: an output bound to last step's value would be taken as a
    // pre-allocated buffer of last step's shape.
    for (const auto& name : outputs) binding_.BindOutput(name.c_str(), cpu_memory());
    outputs_on_fixed_ = false;
  }
  if (strategy_->static_binding()) {
    for (const auto& feed : feeds) stage_input(feed);
  } else {
    for (const auto& feed : feeds) binding_.BindInput(feed.name.c_str(), *feed.value);
  }
}

void KVCache::bind_layout(const std::vector<std::string>& outputs) {
  forget_binding();
  for (size_t i = 0; i < pairs_.size(); ++i) strategy_->bind(binding_, i);
  for (const auto& name : outputs) binding_.BindOutput(name.c_str(), cpu_memory());
  bound_outputs_ = outputs;
  layout_valid_ = true;
}

// A feed of the shape it had last step is copied into the tensor already bound.
void KVCache::stage_input(const Feed& feed) {
  auto found = staged_inputs_.find(feed.name);
  if (found == staged_inputs_.end() || found->second.shape != feed.shape ||
      found->second.type != feed.type) {
    StagedInput staged{std::make_shared<Ort::Value>(Ort::Value::CreateTensor(
                           host_allocator_, feed.shape.data(), feed.shape.size(), feed.type)),
                       feed.shape, feed.type};
    binding_.BindInput(feed.name.c_str(), *staged.value);
    found = staged_inputs_.insert_or_assign(feed.name, std::move(staged)).first;
  }
  if (feed.bytes > 0) {
    std::memcpy(found->second.value->GetTensorMutableRawData(), feed.value->GetTensorRawData(),
                feed.bytes);
  }
}

void KVCache::run() {
  try {
    session_->run_binding(binding_);
  } catch (const RunError&) {
    if (!reuse_outputs_) throw;
    // An output whose shape depends on more than the token count: stop reusing, run again.
    fixed_outputs_.clear();
    fixed_tokens_ = 0;
    reuse_outputs_ = outputs_on_fixed_ = false;
    for (const auto& name : bound_outputs_) binding_.BindOutput(name.c_str(), cpu_memory());
    session_->run_binding(binding_);
  }
}

std::vector<NamedValue> KVCache::collect(const std::vector<std::string>& outputs, int64_t added,
                                         int64_t total) {
  std::vector<NamedValue> result;
  if (reuse_outputs_) {
    for (size_t i = 0; i < outputs.size(); ++i) result.push_back({outputs[i], fixed_outputs_[i]});
    last_present_ptrs_ = past_ptrs();  // static binding: presents are the bound pasts
    return result;
  }
  std::vector<Ort::Value> values = binding_.GetOutputValues();
  if (values.size() != pairs_.size() + outputs.size()) {
    layout_valid_ = false;
    throw RunError(cat("ONNX Runtime returned ", values.size(), " outputs, expected ",
                       pairs_.size() + outputs.size()));
  }
  last_present_ptrs_.assign(pairs_.size(), 0);
  for (size_t i = 0; i < pairs_.size(); ++i) {
    last_present_ptrs_[i] = reinterpret_cast<uintptr_t>(values[i].GetTensorRawData());
    strategy_->accept(i, std::move(values[i]), total);
  }
  std::vector<NamedValue> named = named_values(values, pairs_.size(), outputs);
  result.insert(result.end(), named.begin(), named.end());
  if (strategy_->static_binding()) {
    fixed_outputs_.clear();
    for (const auto& output : result) fixed_outputs_.push_back(output.value);
    fixed_tokens_ = added;
  }
  return result;
}

std::vector<uintptr_t> KVCache::past_ptrs() const {
  std::vector<uintptr_t> ptrs;
  for (size_t i = 0; i < pairs_.size(); ++i) {
    ptrs.push_back(reinterpret_cast<uintptr_t>(strategy_->past(i).GetTensorRawData()));
  }
  return ptrs;
}

std::vector<int64_t> KVCache::read_shape(size_t index) const {
  if (index >= pairs_.size()) throw RunError(cat("KV tensor index ", index, " out of range"));
  return pairs_[index].shape(batch_, length_);
}

void KVCache::read(size_t index, void* dst) const {
  read_shape(index);  // range check
  if (session_->on_device()) throw RunError("reading KV tensors on a device is not supported");
  copy_sequence_prefix(strategy_->past(index), 0, batch_, length_, dst, pairs_[index].seq_axis);
}

}  // namespace onnx_tts
