#include "tensor.h"

#include <cstring>
#include <sstream>

#include "errors.h"

namespace onnx_tts {

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

std::string spec_string(const TensorSpec& spec) {
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

const OrtMemoryInfo* cpu_memory() {
  static Ort::MemoryInfo info = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPU);
  return info;
}

void copy_sequence_prefix(const Ort::Value& src, int64_t first_row, int64_t rows, int64_t length,
                          void* dst) {
  auto info = src.GetTensorTypeAndShapeInfo();
  std::vector<int64_t> shape = info.GetShape();
  size_t element = element_type_of(info.GetElementType(), "KV").size;
  // Per (row, head): `length` tokens of head_dim elements out of a stride of shape[2] tokens.
  size_t chunk = static_cast<size_t>(length * shape[3]) * element;
  size_t stride = static_cast<size_t>(shape[2] * shape[3]) * element;
  const auto* from = static_cast<const uint8_t*>(src.GetTensorRawData()) +
                     static_cast<size_t>(first_row * shape[1]) * stride;
  auto* to = static_cast<uint8_t*>(dst);
  if (chunk == 0) return;
  for (int64_t i = 0; i < rows * shape[1]; ++i) {
    std::memcpy(to + static_cast<size_t>(i) * chunk, from + static_cast<size_t>(i) * stride, chunk);
  }
}

void write_sequence_prefix(Ort::Value& dst, int64_t first_row, int64_t rows, int64_t length,
                           const void* src) {
  auto info = dst.GetTensorTypeAndShapeInfo();
  std::vector<int64_t> shape = info.GetShape();
  size_t element = element_type_of(info.GetElementType(), "KV").size;
  size_t chunk = static_cast<size_t>(length * shape[3]) * element;
  size_t stride = static_cast<size_t>(shape[2] * shape[3]) * element;
  auto* to = static_cast<uint8_t*>(dst.GetTensorMutableRawData()) +
             static_cast<size_t>(first_row * shape[1]) * stride;
  const auto* from = static_cast<const uint8_t*>(src);
  if (chunk == 0) return;
  for (int64_t i = 0; i < rows * shape[1]; ++i) {
    std::memcpy(to + static_cast<size_t>(i) * stride, from + static_cast<size_t>(i) * chunk, chunk);
  }
}

}  // namespace onnx_tts
