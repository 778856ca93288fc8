// onnx_tts._core: a thin session layer over the ONNX Runtime C++ API.
//
// Small surface on purpose:
//   init(library_path, ...)        load the ORT shared library that ships in the onnxruntime wheel
//   Session                        one graph: introspection, numpy run, device-resident values
//   Value                          an OrtValue kept in ORT memory between runs
//   KVCache                        an LM session's KV cache in copy / chain / inplace mode
//
// The library is opened with dlopen rather than linked, so the extension imports with or
// without `import onnxruntime` and always uses the one ORT of the installed wheel (CPU or GPU).

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <dlfcn.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------------------------------------
// Errors. Two kinds reach Python: a graph that cannot be loaded, and a run/feed that is wrong.

struct ModelLoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// Library loading and the process-wide environment.

struct Runtime {
  void* handle = nullptr;
  const OrtApi* api = nullptr;
  std::string version;
  std::string library_path;
  std::unique_ptr<Ort::Env> env;
  std::mutex mutex;
};

Runtime& runtime() {
  static Runtime instance;
  return instance;
}

void require_init() {
  if (runtime().api == nullptr) {
    throw RunError("onnx_tts._core is not initialised: call onnx_tts._core.init(library_path) first");
  }
}

void init_runtime(const std::string& library_path, int global_intra_threads, bool allow_spinning) {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mutex);
  if (rt.api != nullptr) {
    if (library_path != rt.library_path) {
      throw RunError(cat("onnx_tts._core already uses ", rt.library_path, "; cannot switch to ",
                         library_path, " in the same process"));
    }
    return;
  }
  void* handle = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    throw RunError(cat("cannot load the ONNX Runtime library ", library_path, ": ",
                       reason ? reason : "unknown error"));
  }
  using GetApiBase = const OrtApiBase* (*)();
  auto get_api_base = reinterpret_cast<GetApiBase>(dlsym(handle, "OrtGetApiBase"));
  if (get_api_base == nullptr) {
    dlclose(handle);
    throw RunError(cat(library_path, " does not export OrtGetApiBase: not an ONNX Runtime library"));
  }
  const OrtApiBase* base = get_api_base();
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    std::string found = base->GetVersionString();
    dlclose(handle);
    throw RunError(cat("ONNX Runtime ", found, " does not provide C API version ", ORT_API_VERSION,
                       " (it is older than the headers onnx_tts was built with)"));
  }
  Ort::InitApi(api);
  rt.handle = handle;
  rt.api = api;
  rt.version = base->GetVersionString();
  rt.library_path = library_path;
  // Global thread pools exist so sessions can opt into sharing one pool; sessions keep their own
  // pools unless asked. Spinning off by default: on 2 shared cores a spinning pool steals time.
  Ort::ThreadingOptions threading;
  threading.SetGlobalIntraOpNumThreads(global_intra_threads);
  threading.SetGlobalInterOpNumThreads(1);
  threading.SetGlobalSpinControl(allow_spinning ? 1 : 0);
  rt.env = std::make_unique<Ort::Env>(threading, ORT_LOGGING_LEVEL_ERROR, "onnx_tts");
}

// ---------------------------------------------------------------------------------------------
// Element types.

struct ElementType {
  ONNXTensorElementDataType onnx;
  const char* numpy;  // numpy dtype name
  size_t size;
};

const std::vector<ElementType>& element_types() {
  static const std::vector<ElementType> types = {
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32", 4},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16", 2},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, "float64", 8},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, "int8", 1},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, "uint8", 1},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, "int16", 2},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, "uint16", 2},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32", 4},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32, "uint32", 4},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, "int64", 8},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64, "uint64", 8},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, "bool", 1},
  };
  return types;
}

const ElementType* find_element_type(ONNXTensorElementDataType onnx) {
  for (const auto& type : element_types()) {
    if (type.onnx == onnx) return &type;
  }
  return nullptr;
}

const ElementType& element_type_of(ONNXTensorElementDataType onnx, const std::string& tensor) {
  const ElementType* type = find_element_type(onnx);
  if (type == nullptr) {
    throw RunError(cat("tensor '", tensor, "' has ONNX element type ", static_cast<int>(onnx),
                       ", which onnx_tts does not support"));
  }
  return *type;
}

std::string dtype_name(ONNXTensorElementDataType onnx) {
  const ElementType* type = find_element_type(onnx);
  return type ? type->numpy : cat("onnx_type_", static_cast<int>(onnx));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

// ---------------------------------------------------------------------------------------------
// Graph introspection.

struct TensorSpec {
  std::string name;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;            // -1 where the dimension is symbolic
  std::vector<std::string> dim_names;    // symbolic names ("" where fixed or unnamed)
  bool is_tensor = true;

  py::dict to_python() const {
    py::dict info;
    info["name"] = name;
    info["dtype"] = dtype_name(type);
    py::list dims;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] >= 0) {
        dims.append(shape[i]);
      } else if (!dim_names[i].empty()) {
        dims.append(dim_names[i]);
      } else {
        dims.append(py::none());
      }
    }
    info["shape"] = py::tuple(dims);
    return info;
  }
};

TensorSpec read_spec(const std::string& name, const Ort::TypeInfo& info) {
  TensorSpec spec;
  spec.name = name;
  if (info.GetONNXType() != ONNX_TYPE_TENSOR) {
    spec.is_tensor = false;
    return spec;
  }
  auto tensor_info = info.GetTensorTypeAndShapeInfo();
  spec.type = tensor_info.GetElementType();
  spec.shape = tensor_info.GetShape();
  std::vector<const char*> symbolic(spec.shape.size(), nullptr);
  if (!symbolic.empty()) tensor_info.GetSymbolicDimensions(symbolic.data(), symbolic.size());
  for (const char* dim : symbolic) spec.dim_names.emplace_back(dim ? dim : "");
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Value: an OrtValue that stays in ORT memory. Shared so several bindings may hold it.

struct Value {
  std::shared_ptr<Ort::Value> value;

  std::vector<int64_t> shape() const { return value->GetTensorTypeAndShapeInfo().GetShape(); }
  ONNXTensorElementDataType type() const {
    return value->GetTensorTypeAndShapeInfo().GetElementType();
  }
  uintptr_t data_ptr() const {
    return reinterpret_cast<uintptr_t>(value->GetTensorRawData());
  }
  bool on_cpu() const {
    return value->GetTensorMemoryInfo().GetDeviceType() == OrtMemoryInfoDeviceType_CPU;
  }
};

py::array to_numpy(const Ort::Value& value, const std::string& name) {
  auto info = value.GetTensorTypeAndShapeInfo();
  const ElementType& type = element_type_of(info.GetElementType(), name);
  std::vector<int64_t> shape = info.GetShape();
  if (value.GetTensorMemoryInfo().GetDeviceType() != OrtMemoryInfoDeviceType_CPU) {
    throw RunError(cat("tensor '", name, "' lives on a device; bind it to CPU to read it"));
  }
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  py::array out(py::dtype(type.numpy), dims);
  size_t bytes = static_cast<size_t>(element_count(shape)) * type.size;
  if (bytes > 0) std::memcpy(out.mutable_data(), value.GetTensorRawData(), bytes);
  return out;
}

// A feed prepared for a run: an OrtValue over numpy memory (kept alive by `owner`) or a Value.
struct Feed {
  std::string name;
  std::shared_ptr<Ort::Value> value;
  py::object owner;
  std::vector<int64_t> shape;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  size_t bytes = 0;
};

Ort::MemoryInfo& cpu_memory() {
  static Ort::MemoryInfo info = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPU);
  return info;
}

// ---------------------------------------------------------------------------------------------
// Session.

struct SessionConfig {
  std::vector<std::string> providers{"CPUExecutionProvider"};
  int intra_op_threads = 0;
  int inter_op_threads = 0;
  std::string optimization = "all";
  bool shared_thread_pool = false;
  bool allow_spinning = true;
  int device_id = 0;
};

GraphOptimizationLevel parse_optimization(const std::string& level) {
  if (level == "disable") return ORT_DISABLE_ALL;
  if (level == "basic") return ORT_ENABLE_BASIC;
  if (level == "extended") return ORT_ENABLE_EXTENDED;
  if (level == "all") return ORT_ENABLE_ALL;
  throw RunError(cat("graph_optimization_level '", level,
                     "' is not one of: disable, basic, extended, all"));
}

class Session {
 public:
  Session(const std::string& path, const SessionConfig& config) : path_(path) {
    require_init();
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
      session_ = std::make_unique<Ort::Session>(*runtime().env, path.c_str(), options);
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

  const std::string& path() const { return path_; }
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  Ort::Session& ort() { return *session_; }
  // Where KV and other device-resident values live: the CUDA device or host memory.
  const OrtMemoryInfo* kv_memory() const {
    return device_memory_ ? static_cast<const OrtMemoryInfo*>(*device_memory_)
                          : static_cast<const OrtMemoryInfo*>(cpu_memory());
  }
  bool on_device() const { return device_memory_ != nullptr; }

  const TensorSpec* find_input(const std::string& name) const {
    for (const auto& spec : inputs_) {
      if (spec.name == name) return &spec;
    }
    return nullptr;
  }
  const TensorSpec* find_output(const std::string& name) const {
    for (const auto& spec : outputs_) {
      if (spec.name == name) return &spec;
    }
    return nullptr;
  }

  std::string input_names() const { return names_of(inputs_); }
  std::string output_names() const { return names_of(outputs_); }

  // Checks a feed against the graph's declared input and wraps it as an OrtValue.
  Feed prepare_feed(const std::string& name, const py::handle& object) const {
    const TensorSpec* spec = find_input(name);
    if (spec == nullptr) {
      throw RunError(cat("unknown input '", name, "' for graph ", path_,
                         "; its inputs are: ", input_names()));
    }
    Feed feed;
    feed.name = name;
    if (py::isinstance<Value>(object)) {
      const Value& value = object.cast<const Value&>();
      check_against_spec(*spec, value.type(), value.shape());
      feed.value = value.value;
      feed.owner = py::reinterpret_borrow<py::object>(object);
      feed.shape = value.shape();
      feed.type = value.type();
      feed.bytes = static_cast<size_t>(element_count(feed.shape)) *
                   element_type_of(feed.type, name).size;
      return feed;
    }
    if (!py::isinstance<py::array>(object)) {
      throw RunError(cat("input '", name, "' must be a numpy array, got ",
                         py::str(py::type::of(object)).cast<std::string>()));
    }
    auto array = py::reinterpret_borrow<py::array>(object);
    const ElementType& expected = element_type_of(spec->type, name);
    if (!array.dtype().is(py::dtype(expected.numpy))) {
      throw RunError(cat("input '", name, "' has dtype ", py::str(array.dtype()).cast<std::string>(),
                         ", the graph expects ", expected.numpy));
    }
    std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
    check_against_spec(*spec, spec->type, shape);
    // C-contiguous memory is wrapped without a copy; anything else is made contiguous first.
    py::array contiguous = py::array::ensure(array, py::array::c_style);
    if (!contiguous) throw RunError(cat("input '", name, "' cannot be made contiguous"));
    size_t bytes = static_cast<size_t>(contiguous.nbytes());
    if (bytes == 0) {
      Ort::AllocatorWithDefaultOptions allocator;
      feed.value = std::make_shared<Ort::Value>(
          Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), spec->type));
    } else {
      feed.value = std::make_shared<Ort::Value>(Ort::Value::CreateTensor(
          cpu_memory(), const_cast<void*>(contiguous.data()), bytes, shape.data(), shape.size(),
          spec->type));
    }
    feed.owner = contiguous;
    feed.shape = std::move(shape);
    feed.type = spec->type;
    feed.bytes = bytes;
    return feed;
  }

  void check_against_spec(const TensorSpec& spec, ONNXTensorElementDataType type,
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

  static std::string spec_string(const TensorSpec& spec) {
    std::ostringstream out;
    out << "[";
    for (size_t i = 0; i < spec.shape.size(); ++i) {
      out << (i ? ", " : "");
      if (spec.shape[i] >= 0) {
        out << spec.shape[i];
      } else {
        out << (spec.dim_names[i].empty() ? "?" : spec.dim_names[i]);
      }
    }
    out << "]";
    return out.str();
  }

  void check_outputs_requested(const std::vector<std::string>& names) const {
    for (const auto& name : names) {
      if (find_output(name) == nullptr) {
        throw RunError(cat("unknown output '", name, "' for graph ", path_,
                           "; its outputs are: ", output_names()));
      }
    }
  }

  void check_all_inputs_fed(const std::vector<Feed>& feeds) const {
    std::vector<std::string> missing;
    for (const auto& spec : inputs_) {
      bool fed = std::any_of(feeds.begin(), feeds.end(),
                             [&](const Feed& feed) { return feed.name == spec.name; });
      if (!fed) missing.push_back(cat("'", spec.name, "' (", dtype_name(spec.type), " ",
                                      spec_string(spec), ")"));
    }
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", " : "") + missing[i];
      throw RunError(cat("missing input(s) for graph ", path_, ": ", list));
    }
  }

  std::vector<Feed> prepare_feeds(const py::dict& feeds) const {
    std::vector<Feed> prepared;
    for (const auto& item : feeds) {
      if (!py::isinstance<py::str>(item.first)) throw RunError("feed names must be strings");
      prepared.push_back(prepare_feed(item.first.cast<std::string>(), item.second));
    }
    check_all_inputs_fed(prepared);
    return prepared;
  }

  // Plain run: numpy in, numpy out.
  py::dict run(const py::dict& feeds, const std::optional<std::vector<std::string>>& requested,
               bool keep_values) {
    std::vector<Feed> prepared = prepare_feeds(feeds);
    std::vector<std::string> names = requested ? *requested : all_output_names();
    check_outputs_requested(names);
    Ort::IoBinding binding(*session_);
    for (const auto& feed : prepared) binding.BindInput(feed.name.c_str(), *feed.value);
    for (const auto& name : names) {
      binding.BindOutput(name.c_str(), keep_values ? kv_memory() : cpu_memory());
    }
    run_binding(binding);
    std::vector<Ort::Value> values = binding.GetOutputValues();
    std::vector<std::string> bound_names = binding.GetOutputNames();
    py::dict result;
    for (size_t i = 0; i < values.size(); ++i) {
      if (keep_values) {
        result[py::str(bound_names[i])] = Value{std::make_shared<Ort::Value>(std::move(values[i]))};
      } else {
        result[py::str(bound_names[i])] = to_numpy(values[i], bound_names[i]);
      }
    }
    return result;
  }

  void run_binding(Ort::IoBinding& binding) {
    std::string failure;
    {
      py::gil_scoped_release release;
      try {
        session_->Run(run_options_, binding);
      } catch (const Ort::Exception& error) {
        failure = error.what();
      }
    }
    if (!failure.empty()) throw RunError(cat("running ", path_, " failed: ", failure));
  }

  std::vector<std::string> all_output_names() const {
    std::vector<std::string> names;
    for (const auto& spec : outputs_) names.push_back(spec.name);
    return names;
  }

 private:
  static std::string names_of(const std::vector<TensorSpec>& specs) {
    std::string list;
    for (size_t i = 0; i < specs.size(); ++i) list += (i ? ", " : "") + specs[i].name;
    return list;
  }

  std::string path_;
  std::unique_ptr<Ort::Session> session_;
  std::unique_ptr<Ort::MemoryInfo> device_memory_;
  Ort::RunOptions run_options_;
  std::vector<TensorSpec> inputs_;
  std::vector<TensorSpec> outputs_;
};

// ---------------------------------------------------------------------------------------------
// KV cache.

enum class KVMode { Copy, Chain, InPlace };

KVMode parse_mode(const std::string& mode) {
  if (mode == "copy") return KVMode::Copy;
  if (mode == "chain") return KVMode::Chain;
  if (mode == "inplace") return KVMode::InPlace;
  throw RunError(cat("KV mode '", mode, "' is not one of: copy, chain, inplace"));
}

// Parses the layer index and the key/value kind out of a KV tensor name, e.g.
// "past_key_values.10.key" -> (10, "key"); "present.3.value" -> (3, "value").
std::optional<std::pair<int, std::string>> parse_kv_name(const std::string& name,
                                                          const std::regex& pattern) {
  std::smatch match;
  if (!std::regex_match(name, match, pattern)) return std::nullopt;
  return std::make_pair(std::stoi(match[1].str()), match[2].str());
}

struct KVPair {
  int layer;
  std::string kind;
  std::string past;     // input name
  std::string present;  // output name
  ONNXTensorElementDataType type;
  int64_t heads;
  int64_t head_dim;
  size_t element_size;
};

class KVCache {
 public:
  KVCache(std::shared_ptr<Session> session, const std::string& mode, int64_t batch_size,
          std::optional<int64_t> capacity, const std::optional<std::map<std::string, std::string>>& pairs)
      : session_(std::move(session)), mode_(parse_mode(mode)), batch_(batch_size),
        binding_(session_->ort()) {
    if (batch_ < 1) throw RunError(cat("batch_size must be >= 1, got ", batch_));
    build_pairs(pairs);
    if (mode_ == KVMode::InPlace) {
      if (!capacity || *capacity < 1) {
        throw RunError("KV mode 'inplace' needs a capacity (the maximum number of cached tokens)");
      }
      capacity_ = *capacity;
    } else if (capacity) {
      capacity_ = *capacity;
    }
    for (const auto& spec : session_->outputs()) {
      if (!is_present_output(spec.name)) other_outputs_.push_back(spec.name);
    }
    required_inputs_ = session_->inputs().size() - pairs_.size();
    seqlens_input_ = session_->find_input("seqlens_k") != nullptr;
    total_length_input_ = session_->find_input("total_sequence_length") != nullptr;
    allocate();
  }

  int64_t length() const { return length_; }
  std::optional<int64_t> capacity() const { return capacity_; }
  std::string mode_name() const {
    return mode_ == KVMode::Copy ? "copy" : mode_ == KVMode::Chain ? "chain" : "inplace";
  }
  int64_t batch_size() const { return batch_; }

  py::list pair_list() const {
    py::list result;
    for (const auto& pair : pairs_) result.append(py::make_tuple(pair.past, pair.present));
    return result;
  }

  void reset() {
    length_ = 0;
    last_present_ptrs_.clear();
    // Drop the binding's references so an idle cache holds no chained values.
    binding_.ClearBoundInputs();
    binding_.ClearBoundOutputs();
    layout_valid_ = false;
    fixed_outputs_.clear();
    fixed_tokens_ = 0;
    outputs_on_fixed_ = false;
    staged_inputs_.clear();
    if (mode_ == KVMode::InPlace) return;  // buffers stay; attention reads only `length` tokens
    for (size_t i = 0; i < pairs_.size(); ++i) set_empty_past(i);
  }

  py::dict step(const py::dict& feeds, std::optional<int64_t> new_tokens,
                const std::optional<std::vector<std::string>>& requested) {
    auto step_start = std::chrono::steady_clock::now();
    std::vector<Feed> prepared;
    py::array seqlens_owner, total_owner;
    for (const auto& item : feeds) {
      std::string name = item.first.cast<std::string>();
      if (is_past_input(name)) {
        throw RunError(cat("input '", name, "' is a KV input managed by the cache; do not feed it"));
      }
      prepared.push_back(session_->prepare_feed(name, item.second));
    }
    int64_t added = new_tokens ? *new_tokens : infer_new_tokens(prepared);
    if (added < 1) throw RunError(cat("a step must add at least one token, got ", added));
    int64_t total = length_ + added;
    if (capacity_ && total > *capacity_) {
      throw RunError(cat("KV capacity exceeded: the cache holds ", length_, " tokens, this step adds ",
                         added, ", capacity is ", *capacity_,
                         "; create the KVCache with a larger capacity"));
    }
    // GroupQueryAttention's length inputs are derived here, so a caller cannot make the kernel
    // read or write past the buffers by feeding wrong lengths.
    fill_length_input(prepared, "seqlens_k", seqlens_input_, total - 1, true, seqlens_owner);
    fill_length_input(prepared, "total_sequence_length", total_length_input_, total, false,
                      total_owner);
    check_fed(prepared);

    const std::vector<std::string>& outputs = requested ? *requested : other_outputs_;
    if (!layout_valid_ || outputs != bound_outputs_) {
      session_->check_outputs_requested(outputs);
      for (const auto& name : outputs) {
        if (is_present_output(name)) {
          throw RunError(cat("output '", name, "' is a KV output managed by the cache; read it "
                             "with KVCache.read()"));
        }
      }
      bind_layout(outputs);
    } else if (mode_ != KVMode::InPlace) {
      // chain/copy: the past values changed; presents must be re-bound by device, or ORT would
      // treat last step's present as a pre-allocated buffer of the wrong length.
      for (size_t i = 0; i < pairs_.size(); ++i) {
        binding_.BindInput(pairs_[i].past.c_str(), *past_[i]);
        binding_.BindOutput(pairs_[i].present.c_str(), present_memory());
      }
    }
    // In inplace mode the non-KV outputs of a step with as many tokens as an earlier one are
    // written into that step's output tensors, so no output needs fetching after the run.
    bool reuse_outputs = mode_ == KVMode::InPlace && fixed_tokens_ == added &&
                         fixed_outputs_.size() == outputs.size() && !outputs.empty();
    if (reuse_outputs) {
      if (!outputs_on_fixed_) {
        for (size_t i = 0; i < outputs.size(); ++i) {
          binding_.BindOutput(outputs[i].c_str(), *fixed_outputs_[i]);
        }
        outputs_on_fixed_ = true;
      }
    } else if (layout_valid_) {
      for (const auto& name : outputs) binding_.BindOutput(name.c_str(), cpu_memory());
      outputs_on_fixed_ = false;
    }
    layout_valid_ = true;
    if (mode_ == KVMode::InPlace) {
      // The KV bindings stay from step to step, and so do the inputs: a feed of the shape it
      // had last step is copied into the tensor already bound, so a steady decode step binds
      // nothing at all.
      for (const auto& feed : prepared) stage_input(feed);
    } else {
      for (const auto& feed : prepared) binding_.BindInput(feed.name.c_str(), *feed.value);
    }

    auto run_start = std::chrono::steady_clock::now();
    try {
      session_->run_binding(binding_);
    } catch (const RunError&) {
      if (!reuse_outputs) throw;
      // An output whose shape depends on more than the token count: stop reusing, run again.
      fixed_outputs_.clear();
      fixed_tokens_ = 0;
      reuse_outputs = false;
      outputs_on_fixed_ = false;
      for (const auto& name : outputs) binding_.BindOutput(name.c_str(), cpu_memory());
      session_->run_binding(binding_);
    }
    auto run_end = std::chrono::steady_clock::now();

    if (reuse_outputs) {
      py::dict result;
      for (size_t i = 0; i < outputs.size(); ++i) {
        result[py::str(outputs[i])] = to_numpy(*fixed_outputs_[i], outputs[i]);
      }
      length_ = total;
      finish_step(step_start, run_start, run_end);
      return result;
    }
    std::vector<Ort::Value> values = binding_.GetOutputValues();
    if (values.size() != output_slots_.size()) {
      layout_valid_ = false;
      throw RunError(cat("ONNX Runtime returned ", values.size(), " outputs, expected ",
                         output_slots_.size()));
    }
    py::dict result;
    std::vector<std::shared_ptr<Ort::Value>> fresh_outputs;
    last_present_ptrs_.assign(pairs_.size(), 0);
    for (size_t i = 0; i < values.size(); ++i) {
      int index = output_slots_[i];
      if (index < 0) {
        result[py::str(output_slot_names_[i])] = to_numpy(values[i], output_slot_names_[i]);
        if (mode_ == KVMode::InPlace) {
          fresh_outputs.push_back(std::make_shared<Ort::Value>(std::move(values[i])));
        }
        continue;
      }
      last_present_ptrs_[index] = reinterpret_cast<uintptr_t>(values[i].GetTensorRawData());
      accept_present(static_cast<size_t>(index), std::move(values[i]), total);
    }
    if (mode_ == KVMode::InPlace) {
      fixed_outputs_ = std::move(fresh_outputs);
      fixed_tokens_ = added;
      last_present_ptrs_ = past_ptrs();
    }
    length_ = total;
    finish_step(step_start, run_start, run_end);
    return result;
  }

  void finish_step(std::chrono::steady_clock::time_point step_start,
                   std::chrono::steady_clock::time_point run_start,
                   std::chrono::steady_clock::time_point run_end) {
    auto step_end = std::chrono::steady_clock::now();
    steps_ += 1;
    run_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(run_end - run_start).count();
    step_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(step_end - step_start).count();
  }

  std::vector<uintptr_t> past_ptrs() const {
    std::vector<uintptr_t> ptrs;
    for (const auto& value : past_) ptrs.push_back(reinterpret_cast<uintptr_t>(value->GetTensorRawData()));
    return ptrs;
  }
  std::vector<uintptr_t> present_ptrs() const { return last_present_ptrs_; }

  py::dict stats() const {
    py::dict out;
    out["steps"] = steps_;
    out["run_ns"] = run_ns_;
    out["step_ns"] = step_ns_;
    return out;
  }
  void reset_stats() { steps_ = run_ns_ = step_ns_ = 0; }

  // A copy of one layer's cached keys or values, [B, H, length, Dh], for inspection and tests.
  py::array read(size_t pair_index) const {
    if (pair_index >= pairs_.size()) throw RunError(cat("KV tensor index ", pair_index, " out of range"));
    if (session_->on_device()) throw RunError("reading KV tensors on a device is not supported");
    const KVPair& pair = pairs_[pair_index];
    const ElementType& type = element_type_of(pair.type, pair.past);
    std::vector<int64_t> shape = past_[pair_index]->GetTensorTypeAndShapeInfo().GetShape();
    int64_t stride_tokens = shape[2];
    std::vector<py::ssize_t> dims{batch_, pair.heads, length_, pair.head_dim};
    py::array out(py::dtype(type.numpy), dims);
    auto* dst = static_cast<uint8_t*>(out.mutable_data());
    auto* src = static_cast<const uint8_t*>(past_[pair_index]->GetTensorRawData());
    size_t row = static_cast<size_t>(length_ * pair.head_dim) * type.size;
    for (int64_t b = 0; b < batch_ * pair.heads; ++b) {
      if (row > 0) std::memcpy(dst + b * row, src + b * stride_tokens * pair.head_dim * type.size, row);
    }
    return out;
  }

 private:
  void build_pairs(const std::optional<std::map<std::string, std::string>>& overrides) {
    std::map<std::pair<int, std::string>, std::string> past_by_key, present_by_key;
    if (overrides) {
      int index = 0;
      for (const auto& [past, present] : *overrides) {
        if (session_->find_input(past) == nullptr) {
          throw RunError(cat("KV pair override names input '", past, "', which graph ",
                             session_->path(), " does not have; its inputs are: ",
                             session_->input_names()));
        }
        if (session_->find_output(present) == nullptr) {
          throw RunError(cat("KV pair override names output '", present, "', which graph ",
                             session_->path(), " does not have; its outputs are: ",
                             session_->output_names()));
        }
        past_by_key[{index, ""}] = past;
        present_by_key[{index, ""}] = present;
        ++index;
      }
    } else {
      const std::regex past_pattern(R"((?:past_key_values|past)[._](\d+)[._](key|value))");
      const std::regex present_pattern(R"((?:present|present_key_values)[._](\d+)[._](key|value))");
      for (const auto& spec : session_->inputs()) {
        if (auto parsed = parse_kv_name(spec.name, past_pattern)) past_by_key[*parsed] = spec.name;
      }
      for (const auto& spec : session_->outputs()) {
        if (auto parsed = parse_kv_name(spec.name, present_pattern)) present_by_key[*parsed] = spec.name;
      }
    }
    if (past_by_key.empty()) {
      throw RunError(cat("graph ", session_->path(), " has no KV inputs named like "
                         "past_key_values.N.key / past_key_values.N.value; its inputs are: ",
                         session_->input_names(), " (pass pairs= to name them explicitly)"));
    }
    // std::map orders by the parsed layer number, so ".10" comes after ".2".
    for (const auto& [key, past] : past_by_key) {
      auto found = present_by_key.find(key);
      if (found == present_by_key.end()) {
        throw RunError(cat("KV input '", past, "' has no matching present output in graph ",
                           session_->path(), "; its outputs are: ", session_->output_names()));
      }
      const TensorSpec* spec = session_->find_input(past);
      if (spec->shape.size() != 4) {
        throw RunError(cat("KV input '", past, "' has rank ", spec->shape.size(),
                           "; expected [batch, heads, sequence, head_dim]"));
      }
      if (spec->shape[1] < 0 || spec->shape[3] < 0) {
        throw RunError(cat("KV input '", past, "' has symbolic heads or head_dim (",
                           Session::spec_string(*spec), "); the cache needs them fixed"));
      }
      const TensorSpec* out_spec = session_->find_output(found->second);
      if (out_spec->type != spec->type) {
        throw RunError(cat("KV input '", past, "' is ", dtype_name(spec->type), " but output '",
                           found->second, "' is ", dtype_name(out_spec->type)));
      }
      pairs_.push_back(KVPair{key.first, key.second, past, found->second, spec->type,
                              spec->shape[1], spec->shape[3],
                              element_type_of(spec->type, past).size});
      present_by_key.erase(found);
    }
    if (!present_by_key.empty()) {
      throw RunError(cat("present output '", present_by_key.begin()->second,
                         "' has no matching past input in graph ", session_->path()));
    }
    for (size_t i = 0; i < pairs_.size(); ++i) {
      past_index_[pairs_[i].past] = static_cast<int>(i);
      present_index_[pairs_[i].present] = static_cast<int>(i);
    }
  }

  bool is_past_input(const std::string& name) const { return past_index_.count(name) > 0; }
  bool is_present_output(const std::string& name) const { return present_index_.count(name) > 0; }
  int present_index(const std::string& name) const {
    auto found = present_index_.find(name);
    return found == present_index_.end() ? -1 : found->second;
  }

  struct StagedInput {
    std::shared_ptr<Ort::Value> value;  // owned host tensor, bound once
    std::vector<int64_t> shape;
    ONNXTensorElementDataType type;
  };

  void stage_input(const Feed& feed) {
    auto found = staged_inputs_.find(feed.name);
    if (found == staged_inputs_.end() || found->second.shape != feed.shape ||
        found->second.type != feed.type) {
      StagedInput staged{std::make_shared<Ort::Value>(Ort::Value::CreateTensor(
                             cpu_allocator_, feed.shape.data(), feed.shape.size(), feed.type)),
                         feed.shape, feed.type};
      binding_.BindInput(feed.name.c_str(), *staged.value);
      found = staged_inputs_.insert_or_assign(feed.name, std::move(staged)).first;
    }
    if (feed.bytes > 0) {
      std::memcpy(found->second.value->GetTensorMutableRawData(), feed.value->GetTensorRawData(),
                  feed.bytes);
    }
  }

  const OrtMemoryInfo* present_memory() const {
    return mode_ == KVMode::Copy ? static_cast<const OrtMemoryInfo*>(cpu_memory())
                                 : session_->kv_memory();
  }

  // Binds every KV tensor and the requested outputs from scratch and records the order in which
  // ORT will return the outputs, so steps need no name lookups.
  void bind_layout(const std::vector<std::string>& outputs) {
    binding_.ClearBoundInputs();
    binding_.ClearBoundOutputs();
    output_slots_.clear();
    output_slot_names_.clear();
    for (size_t i = 0; i < pairs_.size(); ++i) {
      binding_.BindInput(pairs_[i].past.c_str(), *past_[i]);
      if (mode_ == KVMode::InPlace) {
        binding_.BindOutput(pairs_[i].present.c_str(), *past_[i]);
      } else {
        binding_.BindOutput(pairs_[i].present.c_str(), present_memory());
      }
      output_slots_.push_back(static_cast<int>(i));
      output_slot_names_.push_back(pairs_[i].present);
    }
    for (const auto& name : outputs) {
      binding_.BindOutput(name.c_str(), cpu_memory());
      output_slots_.push_back(-1);
      output_slot_names_.push_back(name);
    }
    bound_outputs_ = outputs;
    fixed_outputs_.clear();
    fixed_tokens_ = 0;
    outputs_on_fixed_ = false;
    staged_inputs_.clear();
    layout_valid_ = false;  // set by the caller once the per-step outputs are bound
  }

  // Every non-KV input fed exactly once; the slow path only builds the message.
  void check_fed(const std::vector<Feed>& feeds) const {
    if (feeds.size() == required_inputs_) {
      bool unique = true;
      for (size_t i = 0; i < feeds.size() && unique; ++i) {
        for (size_t j = i + 1; j < feeds.size(); ++j) unique &= feeds[i].name != feeds[j].name;
      }
      if (unique) return;
    }
    std::vector<Feed> all = feeds;
    for (const auto& pair : pairs_) {
      Feed kv_feed;
      kv_feed.name = pair.past;
      all.push_back(std::move(kv_feed));
    }
    session_->check_all_inputs_fed(all);
    throw RunError("an input was fed twice");
  }

  Ort::Allocator& kv_allocator() {
    if (!allocator_) allocator_ = std::make_unique<Ort::Allocator>(session_->ort(), session_->kv_memory());
    return *allocator_;
  }

  void allocate() {
    past_.resize(pairs_.size());
    host_.resize(pairs_.size());
    for (size_t i = 0; i < pairs_.size(); ++i) {
      if (mode_ == KVMode::InPlace) {
        std::vector<int64_t> shape{batch_, pairs_[i].heads, *capacity_, pairs_[i].head_dim};
        past_[i] = std::make_shared<Ort::Value>(
            Ort::Value::CreateTensor(kv_allocator(), shape.data(), shape.size(), pairs_[i].type));
        if (!session_->on_device()) {
          size_t bytes = static_cast<size_t>(element_count(shape)) * pairs_[i].element_size;
          std::memset(past_[i]->GetTensorMutableRawData(), 0, bytes);
        }
      } else {
        set_empty_past(i);
      }
    }
  }

  void set_empty_past(size_t i) {
    std::vector<int64_t> shape{batch_, pairs_[i].heads, 0, pairs_[i].head_dim};
    if (mode_ == KVMode::Copy) {
      host_[i].clear();
      past_[i] = std::make_shared<Ort::Value>(Ort::Value::CreateTensor(
          cpu_allocator_, shape.data(), shape.size(), pairs_[i].type));
    } else {
      past_[i] = std::make_shared<Ort::Value>(
          Ort::Value::CreateTensor(kv_allocator(), shape.data(), shape.size(), pairs_[i].type));
    }
  }

  void accept_present(size_t i, Ort::Value&& present, int64_t total) {
    if (mode_ == KVMode::InPlace) return;  // written in place into past_[i]
    std::vector<int64_t> shape = present.GetTensorTypeAndShapeInfo().GetShape();
    std::vector<int64_t> expected{batch_, pairs_[i].heads, total, pairs_[i].head_dim};
    if (shape != expected) {
      throw RunError(cat("output '", pairs_[i].present, "' has shape ", shape_string(shape),
                         ", expected ", shape_string(expected),
                         " (past length + new tokens); is this a Concat-KV graph?"));
    }
    if (mode_ == KVMode::Chain) {
      past_[i] = std::make_shared<Ort::Value>(std::move(present));
      return;
    }
    // copy: what published scripts do with numpy: fetch present to host, feed it back as past.
    size_t bytes = static_cast<size_t>(element_count(shape)) * pairs_[i].element_size;
    host_[i].resize(bytes);
    if (bytes > 0) std::memcpy(host_[i].data(), present.GetTensorRawData(), bytes);
    if (bytes == 0) {
      set_empty_past(i);
    } else {
      past_[i] = std::make_shared<Ort::Value>(Ort::Value::CreateTensor(
          cpu_memory(), host_[i].data(), bytes, shape.data(), shape.size(), pairs_[i].type));
    }
  }

  int64_t infer_new_tokens(const std::vector<Feed>& feeds) const {
    for (const char* name : {"inputs_embeds", "input_ids"}) {
      for (const auto& feed : feeds) {
        if (feed.name != name) continue;
        auto shape = feed.value->GetTensorTypeAndShapeInfo().GetShape();
        if (shape.size() >= 2) return shape[1];
      }
    }
    throw RunError("cannot tell how many tokens this step adds: feed 'inputs_embeds' or "
                   "'input_ids' with shape [batch, tokens, ...], or pass new_tokens=");
  }

  void fill_length_input(std::vector<Feed>& feeds, const char* name, bool present_in_graph,
                         int64_t expected, bool per_batch, py::array& owner) const {
    if (!present_in_graph) return;
    for (const auto& feed : feeds) {
      if (feed.name != name) continue;
      const auto* data = static_cast<const int32_t*>(feed.value->GetTensorRawData());
      size_t count = feed.value->GetTensorTypeAndShapeInfo().GetElementCount();
      for (size_t i = 0; i < count; ++i) {
        if (data[i] != expected) {
          throw RunError(cat("input '", name, "' is ", data[i], " but the cache expects ", expected,
                             " (cached ", length_, " tokens); leave it out and the cache fills it"));
        }
      }
      return;
    }
    std::vector<py::ssize_t> dims;
    if (per_batch) dims.push_back(batch_);
    py::array_t<int32_t> array(dims);
    int32_t* data = array.mutable_data();
    for (py::ssize_t i = 0; i < array.size(); ++i) data[i] = static_cast<int32_t>(expected);
    owner = array;
    feeds.push_back(session_->prepare_feed(name, array));
  }

  std::shared_ptr<Session> session_;
  KVMode mode_;
  int64_t batch_;
  std::optional<int64_t> capacity_;
  Ort::IoBinding binding_;
  Ort::AllocatorWithDefaultOptions cpu_allocator_;
  std::unique_ptr<Ort::Allocator> allocator_;
  std::vector<KVPair> pairs_;
  std::unordered_map<std::string, int> past_index_, present_index_;
  std::vector<std::string> other_outputs_;
  std::vector<std::shared_ptr<Ort::Value>> past_;
  std::vector<std::vector<uint8_t>> host_;
  std::vector<uintptr_t> last_present_ptrs_;
  std::vector<std::string> bound_outputs_;     // non-KV outputs in the current binding
  std::vector<int> output_slots_;               // per bound output: KV pair index, or -1
  std::vector<std::string> output_slot_names_;
  bool layout_valid_ = false;
  std::vector<std::shared_ptr<Ort::Value>> fixed_outputs_;  // inplace: reused output tensors
  int64_t fixed_tokens_ = 0;                                // ... for steps of this many tokens
  bool outputs_on_fixed_ = false;                           // binding points at fixed_outputs_
  std::unordered_map<std::string, StagedInput> staged_inputs_;  // inplace: bound input tensors
  size_t required_inputs_ = 0;                  // non-KV inputs the graph declares
  bool seqlens_input_ = false;
  bool total_length_input_ = false;
  int64_t length_ = 0;
  int64_t steps_ = 0, run_ns_ = 0, step_ns_ = 0;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "onnx-tts C++ session core over the ONNX Runtime C API";
  static py::exception<ModelLoadError> model_error(m, "ModelLoadError", PyExc_RuntimeError);
  static py::exception<RunError> run_error(m, "RunError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const ModelLoadError& error) {
      py::set_error(model_error, error.what());
    } catch (const RunError& error) {
      py::set_error(run_error, error.what());
    } catch (const Ort::Exception& error) {
      py::set_error(run_error, cat("ONNX Runtime: ", error.what()).c_str());
    }
  });

  m.attr("ORT_API_VERSION") = ORT_API_VERSION;
  m.def("init", &init_runtime, py::arg("library_path"), py::arg("global_intra_op_threads") = 0,
        py::arg("allow_spinning") = false,
        "Load the ONNX Runtime shared library (once per process).");
  m.def("is_initialized", [] { return runtime().api != nullptr; });
  m.def("ort_version", [] {
    require_init();
    return runtime().version;
  });
  m.def("library_path", [] { return runtime().library_path; });
  m.def("available_providers", [] {
    require_init();
    return Ort::GetAvailableProviders();
  });

  py::class_<SessionConfig>(m, "SessionConfig")
      .def(py::init<>())
      .def_readwrite("providers", &SessionConfig::providers)
      .def_readwrite("intra_op_threads", &SessionConfig::intra_op_threads)
      .def_readwrite("inter_op_threads", &SessionConfig::inter_op_threads)
      .def_readwrite("graph_optimization_level", &SessionConfig::optimization)
      .def_readwrite("shared_thread_pool", &SessionConfig::shared_thread_pool)
      .def_readwrite("allow_spinning", &SessionConfig::allow_spinning)
      .def_readwrite("device_id", &SessionConfig::device_id);

  py::class_<Value>(m, "Value")
      .def_property_readonly("shape", [](const Value& v) { return v.shape(); })
      .def_property_readonly("dtype", [](const Value& v) { return dtype_name(v.type()); })
      .def_property_readonly("data_ptr", &Value::data_ptr)
      .def_property_readonly("on_cpu", &Value::on_cpu)
      .def("numpy", [](const Value& v) { return to_numpy(*v.value, "value"); });

  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def(py::init<const std::string&, const SessionConfig&>(), py::arg("path"), py::arg("config"))
      .def_property_readonly("path", &Session::path)
      .def_property_readonly("inputs", [](const Session& s) {
        py::list out;
        for (const auto& spec : s.inputs()) out.append(spec.to_python());
        return out;
      })
      .def_property_readonly("outputs", [](const Session& s) {
        py::list out;
        for (const auto& spec : s.outputs()) out.append(spec.to_python());
        return out;
      })
      .def("run", &Session::run, py::arg("feeds"), py::arg("output_names") = py::none(),
           py::arg("keep_values") = false);

  py::class_<KVCache>(m, "KVCache")
      .def(py::init<std::shared_ptr<Session>, const std::string&, int64_t, std::optional<int64_t>,
                    const std::optional<std::map<std::string, std::string>>&>(),
           py::arg("session"), py::arg("mode"), py::arg("batch_size") = 1,
           py::arg("capacity") = py::none(), py::arg("pairs") = py::none())
      .def_property_readonly("length", &KVCache::length)
      .def_property_readonly("capacity", &KVCache::capacity)
      .def_property_readonly("mode", &KVCache::mode_name)
      .def_property_readonly("batch_size", &KVCache::batch_size)
      .def_property_readonly("pairs", &KVCache::pair_list)
      .def("step", &KVCache::step, py::arg("feeds"), py::arg("new_tokens") = py::none(),
           py::arg("output_names") = py::none())
      .def("reset", &KVCache::reset)
      .def("read", &KVCache::read, py::arg("index"))
      .def("past_data_ptrs", &KVCache::past_ptrs)
      .def("present_data_ptrs", &KVCache::present_ptrs)
      .def("stats", &KVCache::stats)
      .def("reset_stats", &KVCache::reset_stats);
}
