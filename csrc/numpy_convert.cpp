#include "numpy_convert.h"

#include <cstring>

#include "errors.h"

namespace onnx_tts {
namespace {

Feed feed_from_python(const Session& session, const std::string& name, const py::handle& object,
                      std::vector<py::object>& keep_alive) {
  const TensorSpec& spec = session.input_spec(name);
  if (py::isinstance<Value>(object)) {
    return session.make_feed(name, object.cast<const Value&>().value);
  }
  if (!py::isinstance<py::array>(object)) {
    throw RunError(cat("input '", name, "' must be a numpy array, got ",
                       py::str(py::type::of(object)).cast<std::string>()));
  }
  auto array = py::reinterpret_borrow<py::array>(object);
  const ElementType& expected = element_type_of(spec.type, name);
  if (!array.dtype().is(py::dtype(expected.numpy))) {
    throw RunError(cat("input '", name, "' has dtype ", py::str(array.dtype()).cast<std::string>(),
                       ", the graph expects ", expected.numpy));
  }
  std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
  session.check_feed(spec, spec.type, shape);
  // C-contiguous memory is wrapped without a copy; anything else is made contiguous first.
  py::array contiguous = py::array::ensure(array, py::array::c_style);
  if (!contiguous) throw RunError(cat("input '", name, "' cannot be made contiguous"));
  auto bytes = static_cast<size_t>(contiguous.nbytes());
  std::shared_ptr<Ort::Value> value;
  if (bytes == 0) {
    Ort::AllocatorWithDefaultOptions allocator;
    value = std::make_shared<Ort::Value>(
        Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), spec.type));
  } else {
    value = std::make_shared<Ort::Value>(
        Ort::Value::CreateTensor(cpu_memory(), const_cast<void*>(contiguous.data()), bytes,
                                 shape.data(), shape.size(), spec.type));
  }
  keep_alive.push_back(contiguous);
  return session.make_feed(name, std::move(value));
}

}  // namespace

std::vector<Feed> feeds_from_python(const Session& session, const py::dict& feeds,
                                    std::vector<py::object>& keep_alive) {
  std::vector<Feed> prepared;
  prepared.reserve(feeds.size());
  for (const auto& item : feeds) {
    if (!py::isinstance<py::str>(item.first)) throw RunError("feed names must be strings");
    prepared.push_back(feed_from_python(session, item.first.cast<std::string>(), item.second,
                                        keep_alive));
  }
  return prepared;
}

std::vector<KVValues> kv_values_from_python(const py::sequence& arrays,
                                            std::vector<py::object>& keep_alive) {
  std::vector<KVValues> values;
  for (size_t i = 0; i < arrays.size(); ++i) {
    py::object item = arrays[i];
    if (!py::isinstance<py::array>(item)) {
      throw RunError(cat("KV prefix item ", i, " must be a numpy array, got ",
                         py::str(py::type::of(item)).cast<std::string>()));
    }
    py::array contiguous = py::array::ensure(item, py::array::c_style);
    if (!contiguous) throw RunError(cat("KV prefix item ", i, " cannot be made contiguous"));
    const ElementType* type = nullptr;
    for (const auto& candidate : element_types()) {
      if (contiguous.dtype().is(py::dtype(candidate.numpy))) type = &candidate;
    }
    if (type == nullptr) {
      throw RunError(cat("KV prefix item ", i, " has unsupported dtype ",
                         py::str(contiguous.dtype()).cast<std::string>()));
    }
    values.push_back(KVValues{contiguous.data(),
                              std::vector<int64_t>(contiguous.shape(),
                                                   contiguous.shape() + contiguous.ndim()),
                              type->onnx});
    keep_alive.push_back(contiguous);
  }
  return values;
}

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

py::dict outputs_to_python(const std::vector<NamedValue>& outputs) {
  py::dict result;
  for (const auto& output : outputs) result[py::str(output.name)] = to_numpy(*output.value, output.name);
  return result;
}

py::dict spec_to_python(const TensorSpec& spec) {
  py::dict info;
  info["name"] = spec.name;
  info["dtype"] = dtype_name(spec.type);
  py::list dims;
  for (size_t i = 0; i < spec.shape.size(); ++i) {
    if (spec.shape[i] >= 0) {
      dims.append(spec.shape[i]);
    } else if (!spec.dim_names[i].empty()) {
      dims.append(spec.dim_names[i]);
    } else {
      dims.append(py::none());
    }
  }
  info["shape"] = py::tuple(dims);
  return info;
}

}  // namespace onnx_tts
