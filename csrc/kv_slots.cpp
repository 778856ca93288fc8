#include "kv_slots.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "errors.h"

namespace onnx_tts {
namespace {
using Clock = std::chrono::steady_clock;

int64_t nanoseconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}

// Sum of one row of a host integer mask, or -1 when the mask is not an int32/int64 host tensor.
int64_t mask_row_sum(const Feed& mask, int64_t row, int64_t width) {
  if (mask.value->GetTensorMemoryInfo().GetDeviceType() != OrtMemoryInfoDeviceType_CPU) return -1;
  int64_t sum = 0;
  if (mask.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
    const auto* data = static_cast<const int64_t*>(mask.value->GetTensorRawData()) + row * width;
    for (int64_t i = 0; i < width; ++i) sum += data[i];
  } else if (mask.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) {
    const auto* data = static_cast<const int32_t*>(mask.value->GetTensorRawData()) + row * width;
    for (int64_t i = 0; i < width; ++i) sum += data[i];
  } else {
    return -1;
  }
  return sum;
}
}  // namespace

KVSlots::KVSlots(std::shared_ptr<Session> session, int64_t rows, int64_t capacity,
                 const KVNames& pairs)
    : session_(std::move(session)), rows_(rows), capacity_(capacity), binding_(session_->ort()),
      length_inputs_(*session_),
      attention_mask_(session_->find_input("attention_mask") != nullptr) {
  if (rows_ < 1 || rows_ > kMaxRows) {
    throw RunError(cat("rows must be in [1, ", kMaxRows, "], got ", rows_));
  }
  if (capacity_ < 1) throw RunError(cat("capacity must be >= 1 token, got ", capacity_));
  pairs_ = resolve_kv_pairs(*session_, pairs);
  for (const auto& pair : pairs_) {
    if (pair.seq_axis != 2) {
      throw RunError(cat("KVSlots needs in-place [rows, heads, capacity, head_dim] buffers; '",
                         pair.past, "' is ", pair.layout(), ", a Concat-grown cache"));
    }
  }
  if (!length_inputs_.any() && !attention_mask_) {
    throw RunError(cat("graph ", session_->path(), " takes neither seqlens_k / "
                       "total_sequence_length nor attention_mask, so its rows cannot hold "
                       "different lengths; KVSlots needs a GroupQueryAttention LM"));
  }
  checked_kv_bytes(pairs_, rows_, capacity_);
  OrtAllocator* allocator = session_->kv_allocator(allocator_);
  for (const auto& pair : pairs_) {
    std::vector<int64_t> shape{rows_, pair.heads, capacity_, pair.head_dim};
    auto buffer = std::make_shared<Ort::Value>(
        Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), pair.type));
    if (!session_->on_device()) {
      std::memset(buffer->GetTensorMutableRawData(), 0,
                  static_cast<size_t>(element_count(shape)) * pair.element_size);
    }
    buffers_.push_back(std::move(buffer));
    past_names_.push_back(pair.past);
    past_set_.insert(pair.past);
    present_set_.insert(pair.present);
  }
  for (const auto& spec : session_->outputs()) {
    if (present_set_.count(spec.name) == 0) other_outputs_.push_back(spec.name);
  }
}

KVSlots::KVSlots(TwinOf of)
    : session_(of.original.session_), rows_(of.original.rows_), capacity_(of.original.capacity_),
      pairs_(of.original.pairs_), buffers_(of.original.buffers_), binding_(session_->ort()),
      length_inputs_(*session_), attention_mask_(of.original.attention_mask_),
      past_names_(of.original.past_names_), past_set_(of.original.past_set_),
      present_set_(of.original.present_set_), other_outputs_(of.original.other_outputs_) {}

std::unique_ptr<KVSlots> KVSlots::twin() const {
  return std::unique_ptr<KVSlots>(new KVSlots(TwinOf{*this}));
}

KVNames KVSlots::pair_names() const {
  KVNames names;
  for (const auto& pair : pairs_) names.emplace_back(pair.past, pair.present);
  return names;
}

int64_t KVSlots::row_stride(size_t index) const {
  if (index >= pairs_.size()) throw RunError(cat("KV tensor index ", index, " out of range"));
  const KVPair& pair = pairs_[index];
  return pair.heads * capacity_ * pair.head_dim * static_cast<int64_t>(pair.element_size);
}

uint8_t* KVSlots::row_start(size_t index, int64_t row) const {
  return static_cast<uint8_t*>(buffers_[index]->GetTensorMutableRawData()) + row * row_stride(index);
}

void KVSlots::check_rows(int64_t first_row, int64_t count) const {
  if (count < 1) throw RunError("a step needs at least one row (lengths is empty)");
  if (first_row < 0 || first_row + count > rows_) {
    throw RunError(cat("rows [", first_row, ", ", first_row + count, ") are outside the slot "
                       "buffers' rows [0, ", rows_, ")"));
  }
}

// Returns the tokens the step adds, after checking every feed's batch dimension.
int64_t KVSlots::check_feeds(const std::vector<Feed>& feeds, int64_t count) const {
  for (const auto& feed : feeds) {
    if (past_set_.count(feed.name)) {
      throw RunError(cat("input '", feed.name, "' is a KV input held by the slots; do not feed it"));
    }
    if (feed.name == "seqlens_k" || feed.name == "total_sequence_length") {
      throw RunError(cat("input '", feed.name, "' is derived from lengths; do not feed it"));
    }
    const TensorSpec& spec = session_->input_spec(feed.name);
    if (!feed.shape.empty() && !spec.shape.empty() && spec.shape[0] < 0 && feed.shape[0] != count) {
      throw RunError(cat("input '", feed.name, "' has batch ", feed.shape[0], " but lengths has ",
                         count, " row(s); feed one row per length"));
    }
  }
  int64_t added = new_tokens_of(feeds);
  if (added < 1) throw RunError(cat("a step must add at least one token, got ", added));
  return added;
}

void KVSlots::check_lengths(const std::vector<int64_t>& lengths, int64_t added) const {
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0 || lengths[i] > capacity_ - added) {
      throw RunError(cat("lengths[", i, "] is ", lengths[i], " but a step adding ", added,
                         " token(s) needs a length in [0, ", capacity_ - added,
                         "] (capacity ", capacity_, ")"));
    }
  }
  // GroupQueryAttention takes several new tokens per row over a batch only as a first prompt.
  bool all_empty = std::all_of(lengths.begin(), lengths.end(), [](int64_t n) { return n == 0; });
  if (added > 1 && lengths.size() > 1 && !all_empty) {
    throw RunError(cat("a step adding ", added, " tokens to ", lengths.size(), " rows needs every "
                       "row empty (a batched first prefill); extend rows that hold tokens one "
                       "row at a time, or one token per row"));
  }
}

// A mask-driven graph computes each row's length from its mask: the mask must say what
// `lengths` says, or attention would read or write other positions than the caller thinks.
void KVSlots::check_mask(const std::vector<Feed>& feeds, const std::vector<int64_t>& totals) const {
  auto mask = std::find_if(feeds.begin(), feeds.end(),
                           [](const Feed& feed) { return feed.name == "attention_mask"; });
  if (mask == feeds.end()) return;  // reported as a missing input
  int64_t longest = *std::max_element(totals.begin(), totals.end());
  if (mask->shape.size() != 2 || mask->shape[1] != longest) {
    throw RunError(cat("input 'attention_mask' has shape ", shape_string(mask->shape), ", expected [",
                       totals.size(), ", ", longest, "] (the longest length + new tokens)"));
  }
  for (size_t i = 0; i < totals.size(); ++i) {
    int64_t sum = mask_row_sum(*mask, static_cast<int64_t>(i), longest);
    if (sum >= 0 && sum != totals[i]) {
      throw RunError(cat("attention_mask row ", i, " marks ", sum, " tokens but lengths[", i,
                         "] + new tokens is ", totals[i], "; mark each row's tokens with 1"));
    }
  }
}

std::vector<NamedValue> KVSlots::step(std::vector<Feed> feeds, int64_t first_row,
                                      const std::vector<int64_t>& lengths,
                                      const std::optional<std::vector<std::string>>& requested) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto step_start = Clock::now();
  auto count = static_cast<int64_t>(lengths.size());
  check_rows(first_row, count);
  int64_t added = check_feeds(feeds, count);
  check_lengths(lengths, added);
  std::vector<int64_t> totals(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) totals[i] = lengths[i] + added;
  length_inputs_.fill(*session_, totals, feeds);
  if (attention_mask_) check_mask(feeds, totals);
  session_->check_all_inputs_fed(feeds, past_names_);
  const std::vector<std::string>& outputs = requested ? *requested : other_outputs_;
  if (outputs != bound_outputs_ || first_row != bound_first_ || count != bound_count_) {
    session_->check_outputs_requested(outputs);
    for (const auto& name : outputs) {
      if (present_set_.count(name)) {
        throw RunError(cat("output '", name, "' is a KV output held by the slots; read it with "
                           "KVSlots.read()"));
      }
    }
    bind_rows(first_row, count, outputs);
  } else {
    // IO binding is stateful: re-bind outputs so last step's values are not reused as buffers.
    for (const auto& name : outputs) binding_.BindOutput(name.c_str(), cpu_memory());
  }
  for (const auto& feed : feeds) binding_.BindInput(feed.name.c_str(), *feed.value);

  auto run_start = Clock::now();
  session_->run_binding(binding_);
  auto run_end = Clock::now();

  std::vector<Ort::Value> values = binding_.GetOutputValues();
  if (values.size() != pairs_.size() + outputs.size()) {
    bound_first_ = -1;
    throw RunError(cat("ONNX Runtime returned ", values.size(), " outputs, expected ",
                       pairs_.size() + outputs.size()));
  }
  last_present_ptrs_.resize(pairs_.size());
  for (size_t i = 0; i < pairs_.size(); ++i) {
    last_present_ptrs_[i] = reinterpret_cast<uintptr_t>(values[i].GetTensorRawData());
  }
  last_first_ = first_row;
  last_count_ = count;
  std::vector<NamedValue> result = named_values(values, pairs_.size(), outputs);
  stats_.steps += 1;
  stats_.run_ns += nanoseconds(run_start, run_end);
  stats_.step_ns += nanoseconds(step_start, Clock::now());
  return result;
}

// Binds rows [first_row, first_row + count) of every buffer as that pair's past and present:
// views over the slot memory, so rows joining or leaving move no data.
void KVSlots::bind_rows(int64_t first_row, int64_t count, const std::vector<std::string>& outputs) {
  binding_.ClearBoundInputs();
  binding_.ClearBoundOutputs();
  views_.clear();
  bound_first_ = -1;
  for (size_t i = 0; i < pairs_.size(); ++i) {
    const KVPair& pair = pairs_[i];
    std::vector<int64_t> shape{count, pair.heads, capacity_, pair.head_dim};
    views_.push_back(Ort::Value::CreateTensor(session_->kv_memory(), row_start(i, first_row),
                                              static_cast<size_t>(count * row_stride(i)),
                                              shape.data(), shape.size(), pair.type));
    // One value as both: GroupQueryAttention then writes the new tokens into the past buffer.
    binding_.BindInput(pair.past.c_str(), views_.back());
    binding_.BindOutput(pair.present.c_str(), views_.back());
  }
  for (const auto& name : outputs) binding_.BindOutput(name.c_str(), cpu_memory());
  bound_outputs_ = outputs;
  bound_first_ = first_row;
  bound_count_ = count;
}

std::vector<uintptr_t> KVSlots::past_ptrs(int64_t first_row, int64_t count) const {
  check_rows(first_row, count);
  std::vector<uintptr_t> ptrs;
  for (size_t i = 0; i < pairs_.size(); ++i) {
    ptrs.push_back(reinterpret_cast<uintptr_t>(row_start(i, first_row)));
  }
  return ptrs;
}

std::vector<uintptr_t> KVSlots::present_ptrs(int64_t first_row, int64_t count) const {
  check_rows(first_row, count);
  if (last_first_ < 0 || first_row < last_first_ || first_row + count > last_first_ + last_count_) {
    throw RunError(cat("rows [", first_row, ", ", first_row + count, ") were not in the last "
                       "step (rows [", std::max<int64_t>(last_first_, 0), ", ",
                       std::max<int64_t>(last_first_, 0) + last_count_, "))"));
  }
  std::vector<uintptr_t> ptrs;
  for (size_t i = 0; i < pairs_.size(); ++i) {
    ptrs.push_back(last_present_ptrs_[i] +
                   static_cast<uintptr_t>((first_row - last_first_) * row_stride(i)));
  }
  return ptrs;
}

void KVSlots::load_prefix(int64_t row, const std::vector<KVValues>& values) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_rows(row, 1);
  if (session_->on_device()) throw RunError("loading a KV prefix on a device is not supported");
  int64_t length = checked_prefix_length(pairs_, values, 1, capacity_);
  for (size_t i = 0; i < pairs_.size(); ++i) {
    write_sequence_prefix(*buffers_[i], row, 1, length, values[i].data);
  }
}

std::vector<int64_t> KVSlots::read_shape(size_t index, int64_t row, int64_t length) const {
  if (index >= pairs_.size()) throw RunError(cat("KV tensor index ", index, " out of range"));
  check_rows(row, 1);
  if (length < 0 || length > capacity_) {
    throw RunError(cat("length ", length, " is outside [0, ", capacity_, "]"));
  }
  return {1, pairs_[index].heads, length, pairs_[index].head_dim};
}

void KVSlots::read(size_t index, int64_t row, int64_t length, void* dst) const {
  read_shape(index, row, length);  // range checks
  if (session_->on_device()) throw RunError("reading KV tensors on a device is not supported");
  copy_sequence_prefix(*buffers_[index], row, 1, length, dst);
}

}  // namespace onnx_tts
