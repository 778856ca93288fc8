#include "runtime.h"

#include <dlfcn.h>

#include <memory>
#include <mutex>

#include "errors.h"

namespace onnx_tts {
namespace {

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

}  // namespace

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

bool runtime_initialized() { return runtime().api != nullptr; }

void require_runtime() {
  if (!runtime_initialized()) {
    throw RunError("onnx_tts._core is not initialised: call onnx_tts._core.init(library_path) first");
  }
}

std::string runtime_version() {
  require_runtime();
  return runtime().version;
}

std::string runtime_library_path() { return runtime().library_path; }

Ort::Env& runtime_env() {
  require_runtime();
  return *runtime().env;
}

}  // namespace onnx_tts
