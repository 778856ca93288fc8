// The Python edge of tensors: numpy arrays and core Values in, numpy arrays out. Needs the GIL.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "session.h"
#include "tensor.h"

namespace onnx_tts {

namespace py = pybind11;

// Feeds for `session` from a dict of name -> numpy array or Value, checked against the graph.
// Arrays are wrapped without a copy when C-contiguous; `keep_alive` holds what the feeds point
// into and must outlive the run.
std::vector<Feed> feeds_from_python(const Session& session, const py::dict& feeds,
                                    std::vector<py::object>& keep_alive);

// KV values from a sequence of numpy arrays (made C-contiguous, dtype kept); `keep_alive`
// holds the arrays the values point into.
std::vector<KVValues> kv_values_from_python(const py::sequence& arrays,
                                            std::vector<py::object>& keep_alive);

// A host copy of an ORT value as a numpy array.
py::array to_numpy(const Ort::Value& value, const std::string& name);

// {name: numpy copy} for run outputs, in order.
py::dict outputs_to_python(const std::vector<NamedValue>& outputs);

// {"name", "dtype", "shape"} with symbolic dimensions as names (None when unnamed).
py::dict spec_to_python(const TensorSpec& spec);

}  // namespace onnx_tts
