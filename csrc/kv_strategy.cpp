#include "kv_strategy.h"

#include <cstring>

#include "errors.h"

namespace onnx_tts {

KVStrategy::KVStrategy(Session& session, const std::vector<KVPair>& pairs, int64_t batch)
    : session_(session), pairs_(pairs), batch_(batch), past_(pairs.size()) {}

std::vector<int64_t> KVStrategy::shape_with(size_t i, int64_t tokens) const {
  return pairs_[i].shape(batch_, tokens);
}

void KVStrategy::check_grown(size_t i, const Ort::Value& present, int64_t total) const {
  std::vector<int64_t> shape = present.GetTensorTypeAndShapeInfo().GetShape();
  std::vector<int64_t> expected = shape_with(i, total);
  if (shape != expected) {
    throw RunError(cat("output '", pairs_[i].present, "' has shape ", shape_string(shape),
                       ", expected ", shape_string(expected), " ", pairs_[i].layout(),
                       " (past length + new tokens); is this a Concat-KV graph?"));
  }
}

OrtAllocator* KVStrategy::kv_allocator() { return session_.kv_allocator(allocator_); }

void KVStrategy::check_adopted(size_t i, const Ort::Value& present, int64_t total,
                               int source_axis) const {
  KVPair source = pairs_[i];
  source.seq_axis = source_axis;
  std::vector<int64_t> shape = present.GetTensorTypeAndShapeInfo().GetShape();
  std::vector<int64_t> expected = source.shape(batch_, total);
  if (shape != expected) {
    throw RunError(cat("prefill output '", pairs_[i].present, "' has shape ", shape_string(shape),
                       ", expected ", shape_string(expected), " ", source.layout()));
  }
  if (present.GetTensorMemoryInfo().GetDeviceType() != OrtMemoryInfoDeviceType_CPU &&
      source_axis != pairs_[i].seq_axis) {
    throw RunError("transposing a prefill graph's KV on a device is not supported");
  }
}

void KVStrategy::write_transposed(size_t i, const Ort::Value& src, int64_t total,
                                  Ort::Value& dst) const {
  const KVPair& pair = pairs_[i];
  std::vector<int64_t> dst_shape = dst.GetTensorTypeAndShapeInfo().GetShape();
  int64_t capacity = dst_shape[static_cast<size_t>(pair.seq_axis)];
  size_t row = static_cast<size_t>(pair.head_dim) * pair.element_size;
  const auto* from = static_cast<const uint8_t*>(src.GetTensorRawData());
  auto* to = static_cast<uint8_t*>(dst.GetTensorMutableRawData());
  // Element (b, s, h) of a [B, S, H, D] or [B, H, S, D] tensor whose sequence holds `length`.
  auto offset = [&](int axis, int64_t length, int64_t b, int64_t s, int64_t h) {
    int64_t index = axis == 1 ? (b * length + s) * pair.heads + h
                              : (b * pair.heads + h) * length + s;
    return static_cast<size_t>(index) * row;
  };
  int source_axis = pair.seq_axis == 1 ? 2 : 1;
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t s = 0; s < total; ++s) {
      for (int64_t h = 0; h < pair.heads; ++h) {
        std::memcpy(to + offset(pair.seq_axis, capacity, b, s, h),
                    from + offset(source_axis, total, b, s, h), row);
      }
    }
  }
}

void KVStrategy::adopt(size_t i, Ort::Value&& present, int64_t total, int source_axis) {
  check_adopted(i, present, total, source_axis);
  if (source_axis == pairs_[i].seq_axis) {
    accept(i, std::move(present), total);
    return;
  }
  std::vector<int64_t> shape = shape_with(i, total);
  Ort::Value transposed =
      Ort::Value::CreateTensor(kv_allocator(), shape.data(), shape.size(), pairs_[i].type);
  write_transposed(i, present, total, transposed);
  accept(i, std::move(transposed), total);
}

// As if a run had returned the values as its present.
void KVStrategy::load(size_t i, const void* src, int64_t length) {
  std::vector<int64_t> shape = shape_with(i, length);
  Ort::Value value =
      Ort::Value::CreateTensor(kv_allocator(), shape.data(), shape.size(), pairs_[i].type);
  size_t bytes = static_cast<size_t>(element_count(shape)) * pairs_[i].element_size;
  std::memcpy(value.GetTensorMutableRawData(), src, bytes);
  accept(i, std::move(value), length);
}

namespace {

class CopyKV final : public KVStrategy {
 public:
  CopyKV(Session& session, const std::vector<KVPair>& pairs, int64_t batch)
      : KVStrategy(session, pairs, batch), host_(pairs.size()) {
    clear();
  }
  const char* name() const override { return "copy"; }

  void clear() override {
    for (size_t i = 0; i < pairs_.size(); ++i) set_empty(i);
  }

  void bind(Ort::IoBinding& binding, size_t i) override {
    binding.BindInput(pairs_[i].past.c_str(), *past_[i]);
    binding.BindOutput(pairs_[i].present.c_str(), cpu_memory());
  }

  // What published scripts do with numpy: fetch present to host, feed it back as past.
  void accept(size_t i, Ort::Value&& present, int64_t total) override {
    check_grown(i, present, total);
    std::vector<int64_t> shape = shape_with(i, total);
    size_t bytes = static_cast<size_t>(element_count(shape)) * pairs_[i].element_size;
    if (bytes == 0) {
      set_empty(i);
      return;
    }
    host_[i].resize(bytes);
    std::memcpy(host_[i].data(), present.GetTensorRawData(), bytes);
    past_[i] = std::make_shared<Ort::Value>(Ort::Value::CreateTensor(
        cpu_memory(), host_[i].data(), bytes, shape.data(), shape.size(), pairs_[i].type));
  }

 private:
  void set_empty(size_t i) {
    host_[i].clear();
    std::vector<int64_t> shape = shape_with(i, 0);
    past_[i] = std::make_shared<Ort::Value>(
        Ort::Value::CreateTensor(host_allocator_, shape.data(), shape.size(), pairs_[i].type));
  }

  Ort::AllocatorWithDefaultOptions host_allocator_;
  std::vector<std::vector<uint8_t>> host_;
};

class ChainKV final : public KVStrategy {
 public:
  ChainKV(Session& session, const std::vector<KVPair>& pairs, int64_t batch)
      : KVStrategy(session, pairs, batch) {
    clear();
  }
  const char* name() const override { return "chain"; }

  void clear() override {
    for (size_t i = 0; i < pairs_.size(); ++i) {
      std::vector<int64_t> shape = shape_with(i, 0);
      past_[i] = std::make_shared<Ort::Value>(
          Ort::Value::CreateTensor(kv_allocator(), shape.data(), shape.size(), pairs_[i].type));
    }
  }

  // Presents are bound by device every step: a value bound last step would be taken as a
  // pre-allocated buffer of the old length.
  void bind(Ort::IoBinding& binding, size_t i) override {
    binding.BindInput(pairs_[i].past.c_str(), *past_[i]);
    binding.BindOutput(pairs_[i].present.c_str(), session_.kv_memory());
  }

  void accept(size_t i, Ort::Value&& present, int64_t total) override {
    check_grown(i, present, total);
    past_[i] = std::make_shared<Ort::Value>(std::move(present));
  }
};

class InPlaceKV final : public KVStrategy {
 public:
  InPlaceKV(Session& session, const std::vector<KVPair>& pairs, int64_t batch, int64_t capacity)
      : KVStrategy(session, pairs, batch) {
    for (size_t i = 0; i < pairs_.size(); ++i) {
      if (pairs_[i].seq_axis != 2) {
        throw RunError(cat("KV mode 'inplace' binds one [batch, heads, capacity, head_dim] buffer "
                           "as past and present (GroupQueryAttention); '", pairs_[i].past, "' is ",
                           pairs_[i].layout(), ", a Concat-grown cache: use 'chain' or 'copy'"));
      }
      std::vector<int64_t> shape = shape_with(i, capacity);
      past_[i] = std::make_shared<Ort::Value>(
          Ort::Value::CreateTensor(kv_allocator(), shape.data(), shape.size(), pairs_[i].type));
      if (!session_.on_device()) {
        size_t bytes = static_cast<size_t>(element_count(shape)) * pairs_[i].element_size;
        std::memset(past_[i]->GetTensorMutableRawData(), 0, bytes);
      }
    }
  }
  const char* name() const override { return "inplace"; }
  // The buffers stay; attention reads only the cached length.
  void clear() override {}
  bool static_binding() const override { return true; }

  void bind(Ort::IoBinding& binding, size_t i) override {
    binding.BindInput(pairs_[i].past.c_str(), *past_[i]);
    binding.BindOutput(pairs_[i].present.c_str(), *past_[i]);
  }

  void accept(size_t, Ort::Value&&, int64_t) override {}  // written in place

  void load(size_t i, const void* src, int64_t length) override {
    write_sequence_prefix(*past_[i], 0, batch_, length, src);
  }

  // A prefill graph's present is its own tensor: copied into the buffer's first tokens.
  void adopt(size_t i, Ort::Value&& present, int64_t total, int source_axis) override {
    check_adopted(i, present, total, source_axis);
    if (session_.on_device() ||
        present.GetTensorMemoryInfo().GetDeviceType() != OrtMemoryInfoDeviceType_CPU) {
      throw RunError("handing a prefill graph's KV to an in-place cache on a device is not supported");
    }
    if (source_axis == pairs_[i].seq_axis) {
      write_sequence_prefix(*past_[i], 0, batch_, total, present.GetTensorRawData());
    } else {
      write_transposed(i, present, total, *past_[i]);
    }
  }
};

}  // namespace

std::unique_ptr<KVStrategy> make_kv_strategy(const std::string& mode, Session& session,
                                             const std::vector<KVPair>& pairs, int64_t batch,
                                             std::optional<int64_t> capacity) {
  if (mode == "copy") return std::make_unique<CopyKV>(session, pairs, batch);
  if (mode == "chain") return std::make_unique<ChainKV>(session, pairs, batch);
  if (mode == "inplace") {
    if (!capacity || *capacity < 1) {
      throw RunError("KV mode 'inplace' needs a capacity (the maximum number of cached tokens)");
    }
    return std::make_unique<InPlaceKV>(session, pairs, batch, *capacity);
  }
  throw RunError(cat("KV mode '", mode, "' is not one of: copy, chain, inplace"));
}

}  // namespace onnx_tts
