// Tensors as the core sees them, in std types only: element types, declared specs, feeds ready
// for a run, and outputs coming back. Conversion from and to numpy lives in numpy_convert.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ort.h"

namespace onnx_tts {

struct ElementType {
  ONNXTensorElementDataType onnx;
  const char* numpy;  // numpy dtype name
  size_t size;
};

const std::vector<ElementType>& element_types();
const ElementType* find_element_type(ONNXTensorElementDataType onnx);
// The element type of `tensor`; RunError naming the tensor when onnx-tts does not support it.
const ElementType& element_type_of(ONNXTensorElementDataType onnx, const std::string& tensor);
std::string dtype_name(ONNXTensorElementDataType onnx);

std::string shape_string(const std::vector<int64_t>& shape);
int64_t element_count(const std::vector<int64_t>& shape);

// One graph input or output as declared.
struct TensorSpec {
  std::string name;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;          // -1 where the dimension is symbolic
  std::vector<std::string> dim_names;  // symbolic names ("" where fixed or unnamed)
  bool is_tensor = true;
};

TensorSpec read_spec(const std::string& name, const Ort::TypeInfo& info);
// "[b, 2, p, 8]": fixed sizes, symbolic names, "?" where unnamed.
std::string spec_string(const TensorSpec& spec);

// An input ready to bind: an OrtValue over memory someone keeps alive for the run.
struct Feed {
  std::string name;
  std::shared_ptr<Ort::Value> value;
  std::vector<int64_t> shape;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  size_t bytes = 0;
};

// An output of a run, in ORT memory until the caller copies it.
struct NamedValue {
  std::string name;
  std::shared_ptr<Ort::Value> value;
};

// A value kept in ORT memory between runs (returned by Session::run with keep_values).
struct Value {
  std::shared_ptr<Ort::Value> value;

  std::vector<int64_t> shape() const { return value->GetTensorTypeAndShapeInfo().GetShape(); }
  ONNXTensorElementDataType type() const {
    return value->GetTensorTypeAndShapeInfo().GetElementType();
  }
  uintptr_t data_ptr() const { return reinterpret_cast<uintptr_t>(value->GetTensorRawData()); }
  bool on_cpu() const {
    return value->GetTensorMemoryInfo().GetDeviceType() == OrtMemoryInfoDeviceType_CPU;
  }
};

const OrtMemoryInfo* cpu_memory();

// `values[first + i]` named `names[i]`, moved out of `values` (a run's outputs after the ones
// a cache or chain keeps).
std::vector<NamedValue> named_values(std::vector<Ort::Value>& values, size_t first,
                                     const std::vector<std::string>& names);

// Copies rows [first_row, first_row + rows) of a host rank-4 tensor, keeping the first
// `length` steps of its sequence axis `seq_axis` (2: [B, H, T, D], 1: [B, T, H, D]), into `dst`
// laid out the same way with T = length.
void copy_sequence_prefix(const Ort::Value& src, int64_t first_row, int64_t rows, int64_t length,
                          void* dst, int seq_axis = 2);
// The reverse: `src` laid out with T = length into the first `length` steps of rows
// [first_row, first_row + rows) of a host tensor.
void write_sequence_prefix(Ort::Value& dst, int64_t first_row, int64_t rows, int64_t length,
                           const void* src, int seq_axis = 2);

// Host KV values for one (past, present) pair, [batch, heads, length, head_dim] contiguous,
// to load into a cache (a cached voice prefix).
struct KVValues {
  const void* data = nullptr;
  std::vector<int64_t> shape;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
};

}  // namespace onnx_tts
