// The two kinds of failure that reach Python: a graph that cannot be loaded, and a run, feed
// or argument that is wrong. Messages name the tensor and say how to fix the call.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace onnx_tts {

struct ModelLoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Concatenates anything streamable into one message.
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace onnx_tts
