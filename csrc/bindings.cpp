// onnx_tts._core: the pybind11 edge of the session core. Python objects are converted here
// (numpy_convert.h), then the C++ classes run on std types with the GIL released, so
// concurrent requests decode in parallel threads.
//
//   init(library_path, ...)  load the ORT shared library that ships in the onnxruntime wheel
//   Session                  one graph: introspection, numpy run, device-resident values
//   Value                    an OrtValue kept in ORT memory between runs
//   KVCache                  an LM session's KV cache in copy / chain / inplace mode
//   KVSlots                  in-place KV slot buffers for batched decoding across requests
//   StateChain               a graph's fixed-size recurrent state fed back from run to run

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "errors.h"
#include "kv_cache.h"
#include "kv_slots.h"
#include "numpy_convert.h"
#include "runtime.h"
#include "session.h"
#include "state_chain.h"

namespace py = pybind11;
using namespace onnx_tts;

namespace {

using OutputNames = std::optional<std::vector<std::string>>;

// Python indices may be negative; the C++ side takes size_t.
size_t kv_index(int64_t index) {
  if (index < 0) throw RunError(cat("KV tensor index ", index, " out of range"));
  return static_cast<size_t>(index);
}

py::dict stats_to_python(const KVStats& stats) {
  py::dict out;
  out["steps"] = stats.steps;
  out["run_ns"] = stats.run_ns;
  out["step_ns"] = stats.step_ns;
  return out;
}

py::list pairs_to_python(const KVNames& names) {
  py::list out;
  for (const auto& [past, present] : names) out.append(py::make_tuple(past, present));
  return out;
}

py::array read_kv(const std::vector<int64_t>& shape, ONNXTensorElementDataType type,
                  const std::function<void(void*)>& copy) {
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  py::array out(py::dtype(element_type_of(type, "KV").numpy), dims);
  copy(out.mutable_data());
  return out;
}

py::dict session_run(Session& session, const py::dict& feeds, const OutputNames& names,
                     bool keep_values) {
  std::vector<py::object> keep_alive;
  std::vector<Feed> prepared = feeds_from_python(session, feeds, keep_alive);
  std::vector<NamedValue> outputs;
  {
    py::gil_scoped_release release;
    outputs = session.run(prepared, names, keep_values);
  }
  if (!keep_values) return outputs_to_python(outputs);
  py::dict result;
  for (auto& output : outputs) result[py::str(output.name)] = Value{output.value};
  return result;
}

py::dict kv_cache_step(KVCache& cache, Session& session, const py::dict& feeds,
                       std::optional<int64_t> new_tokens, const OutputNames& names) {
  std::vector<py::object> keep_alive;
  std::vector<Feed> prepared = feeds_from_python(session, feeds, keep_alive);
  std::vector<NamedValue> outputs;
  {
    py::gil_scoped_release release;
    outputs = cache.step(std::move(prepared), new_tokens, names);
  }
  return outputs_to_python(outputs);
}

py::dict kv_slots_step(KVSlots& slots, Session& session, const py::dict& feeds, int64_t first_row,
                       const std::vector<int64_t>& lengths, const OutputNames& names) {
  std::vector<py::object> keep_alive;
  std::vector<Feed> prepared = feeds_from_python(session, feeds, keep_alive);
  std::vector<NamedValue> outputs;
  {
    py::gil_scoped_release release;
    outputs = slots.step(std::move(prepared), first_row, lengths, names);
  }
  return outputs_to_python(outputs);
}

py::dict kv_cache_prefill(KVCache& cache, Session& source, const py::dict& feeds,
                          const OutputNames& names) {
  std::vector<py::object> keep_alive;
  std::vector<Feed> prepared = feeds_from_python(source, feeds, keep_alive);
  std::vector<NamedValue> outputs;
  {
    py::gil_scoped_release release;
    outputs = cache.prefill(source, std::move(prepared), names);
  }
  return outputs_to_python(outputs);
}

// The caches keep their session alive; the bindings need it to convert feeds.
struct PyKVCache {
  std::shared_ptr<Session> session;
  std::unique_ptr<KVCache> cache;
};

struct PyKVSlots {
  std::shared_ptr<Session> session;
  std::unique_ptr<KVSlots> slots;
};

struct PyStateChain {
  std::shared_ptr<Session> session;
  std::unique_ptr<StateChain> chain;
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
  m.def("is_initialized", &runtime_initialized);
  m.def("ort_version", &runtime_version);
  m.def("library_path", &runtime_library_path);

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
        for (const auto& spec : s.inputs()) out.append(spec_to_python(spec));
        return out;
      })
      .def_property_readonly("outputs", [](const Session& s) {
        py::list out;
        for (const auto& spec : s.outputs()) out.append(spec_to_python(spec));
        return out;
      })
      .def("run", &session_run, py::arg("feeds"), py::arg("output_names") = py::none(),
           py::arg("keep_values") = false);

  py::class_<PyKVCache>(m, "KVCache")
      .def(py::init([](std::shared_ptr<Session> session, const std::string& mode, int64_t batch,
                       std::optional<int64_t> capacity, const KVNames& pairs) {
             auto cache = std::make_unique<KVCache>(session, mode, batch, capacity, pairs);
             return PyKVCache{std::move(session), std::move(cache)};
           }),
           py::arg("session"), py::arg("mode"), py::arg("batch_size"), py::arg("capacity"),
           py::arg("pairs"))
      .def_property_readonly("length", [](const PyKVCache& c) { return c.cache->length(); })
      .def_property_readonly("capacity", [](const PyKVCache& c) { return c.cache->capacity(); })
      .def_property_readonly("mode", [](const PyKVCache& c) { return c.cache->mode(); })
      .def_property_readonly("batch_size", [](const PyKVCache& c) { return c.cache->batch_size(); })
      .def_property_readonly("pairs",
                             [](const PyKVCache& c) { return pairs_to_python(c.cache->pair_names()); })
      .def(
          "step",
          [](PyKVCache& c, const py::dict& feeds, std::optional<int64_t> new_tokens,
             const OutputNames& names) {
            return kv_cache_step(*c.cache, *c.session, feeds, new_tokens, names);
          },
          py::arg("feeds"), py::arg("new_tokens") = py::none(), py::arg("output_names") = py::none())
      .def("reset", [](PyKVCache& c) { c.cache->reset(); })
      .def(
          "prefill",
          [](PyKVCache& c, std::shared_ptr<Session> source, const py::dict& feeds,
             const OutputNames& names) {
            return kv_cache_prefill(*c.cache, *source, feeds, names);
          },
          py::arg("session"), py::arg("feeds"), py::arg("output_names") = py::none())
      .def(
          "load_prefix",
          [](PyKVCache& c, const py::sequence& arrays) {
            std::vector<py::object> keep_alive;
            std::vector<KVValues> values = kv_values_from_python(arrays, keep_alive);
            py::gil_scoped_release release;
            c.cache->load_prefix(values);
          },
          py::arg("values"))
      .def(
          "read",
          [](const PyKVCache& c, int64_t position) {
            size_t index = kv_index(position);
            std::vector<int64_t> shape = c.cache->read_shape(index);
            auto type = c.session->find_input(c.cache->pair_names()[index].first)->type;
            return read_kv(shape, type, [&](void* dst) { c.cache->read(index, dst); });
          },
          py::arg("index"))
      .def("past_data_ptrs", [](const PyKVCache& c) { return c.cache->past_ptrs(); })
      .def("present_data_ptrs", [](const PyKVCache& c) { return c.cache->present_ptrs(); })
      .def("stats", [](const PyKVCache& c) { return stats_to_python(c.cache->stats()); })
      .def("reset_stats", [](PyKVCache& c) { c.cache->reset_stats(); });

  py::class_<PyKVSlots>(m, "KVSlots")
      // Allocating and zeroing hundreds of MB takes hundreds of ms: without the GIL, so a
      // buffer grown beside the decode steps (decoding/kv_rows.py) does not stall them.
      .def(py::init([](std::shared_ptr<Session> session, int64_t rows, int64_t capacity,
                       const KVNames& pairs) {
             auto slots = std::make_unique<KVSlots>(session, rows, capacity, pairs);
             return PyKVSlots{std::move(session), std::move(slots)};
           }),
           py::arg("session"), py::arg("rows"), py::arg("capacity"), py::arg("pairs"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rows", [](const PyKVSlots& s) { return s.slots->rows(); })
      .def_property_readonly("capacity", [](const PyKVSlots& s) { return s.slots->capacity(); })
      .def_property_readonly("pairs",
                             [](const PyKVSlots& s) { return pairs_to_python(s.slots->pair_names()); })
      .def("row_stride", [](const PyKVSlots& s, int64_t index) { return s.slots->row_stride(kv_index(index)); },
           py::arg("index"))
      .def(
          "step",
          [](PyKVSlots& s, const py::dict& feeds, int64_t first_row,
             const std::vector<int64_t>& lengths, const OutputNames& names) {
            return kv_slots_step(*s.slots, *s.session, feeds, first_row, lengths, names);
          },
          py::arg("feeds"), py::arg("first_row"), py::arg("lengths"),
          py::arg("output_names") = py::none())
      .def("past_data_ptrs",
           [](const PyKVSlots& s, int64_t first, int64_t count) { return s.slots->past_ptrs(first, count); },
           py::arg("first_row"), py::arg("count"))
      .def("present_data_ptrs",
           [](const PyKVSlots& s, int64_t first, int64_t count) {
             return s.slots->present_ptrs(first, count);
           },
           py::arg("first_row"), py::arg("count"))
      .def(
          "read",
          [](const PyKVSlots& s, int64_t position, int64_t row, int64_t length) {
            size_t index = kv_index(position);
            std::vector<int64_t> shape = s.slots->read_shape(index, row, length);
            auto type = s.session->find_input(s.slots->pair_names()[index].first)->type;
            return read_kv(shape, type, [&](void* dst) { s.slots->read(index, row, length, dst); });
          },
          py::arg("index"), py::arg("row"), py::arg("length"))
      .def(
          "load_prefix",
          [](PyKVSlots& s, int64_t row, const py::sequence& arrays) {
            std::vector<py::object> keep_alive;
            std::vector<KVValues> values = kv_values_from_python(arrays, keep_alive);
            py::gil_scoped_release release;
            s.slots->load_prefix(row, values);
          },
          py::arg("row"), py::arg("values"))
      .def("stats", [](const PyKVSlots& s) { return stats_to_python(s.slots->stats()); })
      .def(
          "twin", [](const PyKVSlots& s) { return PyKVSlots{s.session, s.slots->twin()}; },
          py::keep_alive<0, 1>());  // the twin binds the original's buffers

  py::class_<PyStateChain>(m, "StateChain")
      .def(py::init([](std::shared_ptr<Session> session, const std::string& mode,
                       const KVNames& pairs, const py::sequence& initial) {
             std::vector<py::object> keep_alive;
             std::vector<KVValues> values = kv_values_from_python(initial, keep_alive);
             auto chain = std::make_unique<StateChain>(session, mode, pairs, values);
             return PyStateChain{std::move(session), std::move(chain)};
           }),
           py::arg("session"), py::arg("mode"), py::arg("pairs"), py::arg("initial"))
      .def_property_readonly("mode", [](const PyStateChain& s) { return s.chain->mode(); })
      .def_property_readonly("steps", [](const PyStateChain& s) { return s.chain->steps(); })
      .def_property_readonly("pairs",
                             [](const PyStateChain& s) { return pairs_to_python(s.chain->pair_names()); })
      .def("reset", [](PyStateChain& s) { s.chain->reset(); })
      .def(
          "step",
          [](PyStateChain& s, const py::dict& feeds, const OutputNames& names) {
            std::vector<py::object> keep_alive;
            std::vector<Feed> prepared = feeds_from_python(*s.session, feeds, keep_alive);
            std::vector<NamedValue> outputs;
            {
              py::gil_scoped_release release;
              outputs = s.chain->step(std::move(prepared), names);
            }
            return outputs_to_python(outputs);
          },
          py::arg("feeds"), py::arg("output_names") = py::none())
      .def("state_data_ptrs", [](const PyStateChain& s) { return s.chain->state_ptrs(); })
      .def("output_data_ptrs", [](const PyStateChain& s) { return s.chain->output_ptrs(); });
}
