// Loading the ONNX Runtime shared library that ships in the onnxruntime wheel, once per process.
//
// The library is opened with dlopen rather than linked, so the extension imports with or
// without `import onnxruntime` and always uses the one ORT of the installed wheel (CPU or GPU).
#pragma once

#include <string>

#include "ort.h"

namespace onnx_tts {

// Loads the library and creates the process-wide environment; a second call with the same path
// is a no-op, with another path an error.
void init_runtime(const std::string& library_path, int global_intra_threads, bool allow_spinning);
bool runtime_initialized();
// Throws RunError unless init_runtime succeeded.
void require_runtime();
std::string runtime_version();
std::string runtime_library_path();
Ort::Env& runtime_env();

}  // namespace onnx_tts
