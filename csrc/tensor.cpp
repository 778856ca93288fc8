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

std::vector<NamedValue> named_values(std::vector<Ort::Value>& values, size_t first,
                                     const std::vector<std::string>& names) {
  std::vector<NamedValue> out;
  out.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    out.push_back({names[i], std::make_shared<Ort::Value>(std::move(values[first + i]))});
  }
  return out;
}

namespace {

// A rank-4 tensor's sequence prefix as equal chunks: `count` chunks of `chunk` bytes, `stride`
// bytes apart, starting `start` bytes in.
struct PrefixChunks {
  size_t count, chunk, stride, start;
};

PrefixChunks prefix_chunks(const Ort::Value& value, int64_t first_row, int64_t rows,
                           int64_t length, int seq_axis) {
  auto info = value.GetTensorTypeAndShapeInfo();
  std::vector<int64_t> shape = info.GetShape();
  auto element = static_cast<int64_t>(element_type_of(info.GetElementType(), "KV").size);
  // Per chunk: the axes after the sequence; chunks per row: the axes between batch and it.
  int64_t inner = element;
  for (size_t axis = static_cast<size_t>(seq_axis) + 1; axis < shape.size(); ++axis) {
    inner *= shape[axis];
  }
  int64_t per_row = 1;
  for (int axis = 1; axis < seq_axis; ++axis) per_row *= shape[static_cast<size_t>(axis)];
  int64_t stride = shape[static_cast<size_t>(seq_axis)] * inner;
  return {static_cast<size_t>(rows * per_row), static_cast<size_t>(length * inner),
          static_cast<size_t>(stride), static_cast<size_t>(first_row * per_row * stride)};
}

}  // namespace

void copy_sequence_prefix(const Ort::Value& src, int64_t first_row, int64_t rows, int64_t length,
                          void* dst, int seq_axis) {
  PrefixChunks c = prefix_chunks(src, first_row, rows, length, seq_axis);
  if (c.chunk == 0) return;
  const auto* from = static_cast<const uint8_t*>(src.GetTensorRawData()) + c.start;
  auto* to = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < c.count; ++i) std::memcpy(to + i * c.chunk, from + i * c.stride, c.chunk);
}

void write_sequence_prefix(Ort::Value& dst, int64_t first_row, int64_t rows, int64_t length,
                           const void* src, int seq_axis) {
  PrefixChunks c = prefix_chunks(dst, first_row, rows, length, seq_axis);
  if (c.chunk == 0) return;
  auto* to = static_cast<uint8_t*>(dst.GetTensorMutableRawData()) + c.start;
  const auto* from = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < c.count; ++i) std::memcpy(to + i * c.stride, from + i * c.chunk, c.chunk);
}

}  // namespace onnx_tts
