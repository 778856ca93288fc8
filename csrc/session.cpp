#include "session.h"

#include <algorithm>

#include "errors.h"
#include "runtime.h"

namespace onnx_tts {
namespace {

GraphOptimizationLevel parse_optimization(const std::string& level) {
  if (level == "disable") return ORT_DISABLE_ALL;
  if (level == "basic") return ORT_ENABLE_BASIC;
  if (level == "extended") return ORT_ENABLE_EXTENDED;
  if (level == "all") return ORT_ENABLE_ALL;
  throw RunError(cat("graph_optimization_level '", level,
                     "' is not one of: disable, basic, extended, all"));
}

std::string names_of(const std::vector<TensorSpec>& specs) {
  std::string list;
  for (size_t i = 0; i < specs.size(); ++i) list += (i ? ", " : "") + specs[i].name;
  return list;
}

}  // namespace

Session::Session(const std::string& path, const SessionConfig& config) : path_(path) {
  require_runtime();
  Ort::SessionOptions options;
  options.SetGraphOptimizationLevel(parse_optimization(config.optimization));
  if (config.shared_thread_pool) {
    options.DisablePerSessionThreads();
  } else {
    options.SetIntraOpNumThreads(config.intra_op_threads);
    options.SetInterOpNumThreads(config.inter_op_threads);
    // Spinning workers keep cores busy after a run: faster back-to-back runs on an idle
    // machine, stolen time for everything else on a shared one.
    options.AddConfigEntry("session.intra_op.allow_spinning", config.allow_spinning ? "1" : "0");
  }
  for (const auto& provider : config.providers) {
    if (provider == "CPUExecutionProvider") continue;
    if (provider == "CUDAExecutionProvider") {
      auto available = Ort::GetAvailableProviders();
      if (std::find(available.begin(), available.end(), provider) == available.end()) {
        throw ModelLoadError(
            "CUDAExecutionProvider is not available in this onnxruntime build; install "
            "onnxruntime-gpu (and a CUDA runtime) or use CPUExecutionProvider");
      }
      OrtCUDAProviderOptionsV2* cuda = nullptr;
      Ort::ThrowOnError(Ort::GetApi().CreateCUDAProviderOptions(&cuda));
      std::unique_ptr<OrtCUDAProviderOptionsV2, decltype(Ort::GetApi().ReleaseCUDAProviderOptions)>
          cuda_guard(cuda, Ort::GetApi().ReleaseCUDAProviderOptions);
      std::string device = std::to_string(config.device_id);
      const char* keys[] = {"device_id"};
      const char* values[] = {device.c_str()};
      Ort::ThrowOnError(Ort::GetApi().UpdateCUDAProviderOptions(cuda, keys, values, 1));
      options.AppendExecutionProvider_CUDA_V2(*cuda);
      device_memory_ = std::make_unique<Ort::MemoryInfo>("Cuda", OrtDeviceAllocator,
                                                         config.device_id, OrtMemTypeDefault);
      continue;
    }
    throw ModelLoadError(cat("unsupported execution provider '", provider,
                             "'; use CPUExecutionProvider or CUDAExecutionProvider"));
  }
  try {
    session_ = std::make_unique<Ort::Session>(runtime_env(), path.c_str(), options);
  } catch (const Ort::Exception& error) {
    throw ModelLoadError(cat("cannot load ONNX graph ", path, ": ", error.what()));
  }
  Ort::AllocatorWithDefaultOptions allocator;
  for (size_t i = 0; i < session_->GetInputCount(); ++i) {
    inputs_.push_back(read_spec(session_->GetInputNameAllocated(i, allocator).get(),
                                session_->GetInputTypeInfo(i)));
  }
  for (size_t i = 0; i < session_->GetOutputCount(); ++i) {
    outputs_.push_back(read_spec(session_->GetOutputNameAllocated(i, allocator).get(),
                                 session_->GetOutputTypeInfo(i)));
  }
}

const OrtMemoryInfo* Session::kv_memory() const {
  return device_memory_ ? static_cast<const OrtMemoryInfo*>(*device_memory_) : cpu_memory();
}

OrtAllocator* Session::kv_allocator(std::unique_ptr<Ort::Allocator>& holder) {
  if (!on_device()) return Ort::AllocatorWithDefaultOptions{};
  if (!holder) holder = std::make_unique<Ort::Allocator>(*session_, kv_memory());
  return *holder;
}

const TensorSpec* Session::find_input(const std::string& name) const {
  for (const auto& spec : inputs_) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

const TensorSpec* Session::find_output(const std::string& name) const {
  for (const auto& spec : outputs_) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

const TensorSpec& Session::input_spec(const std::string& name) const {
  const TensorSpec* spec = find_input(name);
  if (spec == nullptr) {
    throw RunError(cat("unknown input '", name, "' for graph ", path_,
                       "; its inputs are: ", input_names()));
  }
  return *spec;
}

std::string Session::input_names() const { return names_of(inputs_); }
std::string Session::output_names() const { return names_of(outputs_); }

std::vector<std::string> Session::all_output_names() const {
  std::vector<std::string> names;
  for (const auto& spec : outputs_) names.push_back(spec.name);
  return names;
}

Feed Session::make_feed(const std::string& name, std::shared_ptr<Ort::Value> value) const {
  const TensorSpec& spec = input_spec(name);
  auto info = value->GetTensorTypeAndShapeInfo();
  Feed feed;
  feed.name = name;
  feed.type = info.GetElementType();
  feed.shape = info.GetShape();
  check_feed(spec, feed.type, feed.shape);
  feed.bytes = static_cast<size_t>(element_count(feed.shape)) * element_type_of(feed.type, name).size;
  feed.value = std::move(value);
  return feed;
}

void Session::check_feed(const TensorSpec& spec, ONNXTensorElementDataType type,
                         const std::vector<int64_t>& shape) const {
  if (type != spec.type) {
    throw RunError(cat("input '", spec.name, "' has dtype ", dtype_name(type),
                       ", the graph expects ", dtype_name(spec.type)));
  }
  if (shape.size() != spec.shape.size()) {
    throw RunError(cat("input '", spec.name, "' has rank ", shape.size(), " (shape ",
                       shape_string(shape), "), the graph expects rank ", spec.shape.size(),
                       " (shape ", spec_string(spec), ")"));
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) throw RunError(cat("input '", spec.name, "' has a negative dimension"));
    if (spec.shape[i] >= 0 && spec.shape[i] != shape[i]) {
      throw RunError(cat("input '", spec.name, "' has shape ", shape_string(shape),
                         ", the graph expects ", spec_string(spec), " (dimension ", i,
                         " must be ", spec.shape[i], ")"));
    }
  }
}

void Session::check_outputs_requested(const std::vector<std::string>& names) const {
  for (const auto& name : names) {
    if (find_output(name) == nullptr) {
      throw RunError(cat("unknown output '", name, "' for graph ", path_,
                         "; its outputs are: ", output_names()));
    }
  }
}

void Session::check_all_inputs_fed(const std::vector<Feed>& feeds,
                                   const std::vector<std::string>& also_fed) const {
  std::vector<std::string> missing;
  for (const auto& spec : inputs_) {
    bool fed = std::any_of(feeds.begin(), feeds.end(),
                           [&](const Feed& feed) { return feed.name == spec.name; }) ||
               std::find(also_fed.begin(), also_fed.end(), spec.name) != also_fed.end();
    if (!fed) {
      missing.push_back(cat("'", spec.name, "' (", dtype_name(spec.type), " ", spec_string(spec), ")"));
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", " : "") + missing[i];
    throw RunError(cat("missing input(s) for graph ", path_, ": ", list));
  }
  for (size_t i = 0; i < feeds.size(); ++i) {
    for (size_t j = i + 1; j < feeds.size(); ++j) {
      if (feeds[i].name == feeds[j].name) throw RunError(cat("input '", feeds[i].name, "' was fed twice"));
    }
  }
}

std::vector<NamedValue> Session::run(const std::vector<Feed>& feeds,
                                     const std::optional<std::vector<std::string>>& requested,
                                     bool keep_values) {
  check_all_inputs_fed(feeds);
  std::vector<std::string> names = requested ? *requested : all_output_names();
  check_outputs_requested(names);
  Ort::IoBinding binding(*session_);
  for (const auto& feed : feeds) binding.BindInput(feed.name.c_str(), *feed.value);
  for (const auto& name : names) {
    binding.BindOutput(name.c_str(), keep_values ? kv_memory() : cpu_memory());
  }
  run_binding(binding);
  return bound_outputs(binding);
}

void Session::run_binding(Ort::IoBinding& binding) {
  try {
    session_->Run(run_options_, binding);
  } catch (const Ort::Exception& error) {
    throw RunError(cat("running ", path_, " failed: ", error.what()));
  }
}

std::vector<NamedValue> bound_outputs(Ort::IoBinding& binding) {
  std::vector<Ort::Value> values = binding.GetOutputValues();
  std::vector<std::string> names = binding.GetOutputNames();
  if (values.size() != names.size()) {
    throw RunError(cat("ONNX Runtime returned ", values.size(), " outputs for ", names.size(),
                       " bound names"));
  }
  std::vector<NamedValue> out;
  out.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    out.push_back({names[i], std::make_shared<Ort::Value>(std::move(values[i]))});
  }
  return out;
}

}  // namespace onnx_tts
