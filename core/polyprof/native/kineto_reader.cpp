// polyprof's compiled reader of torch's raw profiler result (polyprof.native_reader).
//
// torch's Python API hands out one pybind wrapper per event and one call per
// field, about 0.1 us each: at 200k events, reading what a table needs costs
// more than a quarter of torch's own _disable_profiler(). This module reads
// the same fields straight from torch's C++ KinetoEvent, with the exported
// accessors the Python bindings call, into buffers numpy owns. It is built
// against the installed torch's headers (torch.utils.cpp_extension), once per
// torch build; POLYPROF_HAS_<accessor> says which accessors that torch has, as
// its Python bindings do. polyprof.result_rows reads the same fields in pure
// Python where this module is not built, and the tests compare both. The same module holds the
// Chrome trace line formatter (chrome_lines.cpp), so one build serves both.

#include <torch/csrc/autograd/profiler_kineto.h>
#include <pybind11/pybind11.h>
#ifdef POLYPROF_HAS_activity_type
#include <kineto/ActivityType.h>
#endif

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;
using torch::autograd::profiler::KinetoEvent;
using torch::autograd::profiler::ProfilerResult;

namespace {

using Field = std::function<int64_t(const KinetoEvent&)>;

// Kineto's activity types of record_function ranges (libkineto::ActivityType USER_ANNOTATION and
// GPU_USER_ANNOTATION): what torch's is_user_annotation() compares activityType() with.
constexpr uint8_t kUserAnnotation = 1;
constexpr uint8_t kGpuUserAnnotation = 2;

// Each field by the name of torch's Python accessor, as int64 bits (unsigned ids keep their bits,
// as polyprof's Python path reads them).
const std::unordered_map<std::string, Field>& fields() {
  static const std::unordered_map<std::string, Field> table = {
      {"start_ns", [](const KinetoEvent& e) { return static_cast<int64_t>(e.startNs()); }},
      {"end_ns", [](const KinetoEvent& e) { return static_cast<int64_t>(e.endNs()); }},
      {"start_thread_id", [](const KinetoEvent& e) { return static_cast<int64_t>(e.startThreadId()); }},
      {"end_thread_id", [](const KinetoEvent& e) { return static_cast<int64_t>(e.endThreadId()); }},
      {"fwd_thread_id", [](const KinetoEvent& e) { return static_cast<int64_t>(e.fwdThreadId()); }},
      {"sequence_nr", [](const KinetoEvent& e) { return e.sequenceNr(); }},
      {"scope", [](const KinetoEvent& e) { return static_cast<int64_t>(e.scope()); }},
      {"device_type", [](const KinetoEvent& e) { return static_cast<int64_t>(e.deviceType()); }},
      {"device_index", [](const KinetoEvent& e) { return static_cast<int64_t>(e.deviceIndex()); }},
      {"device_resource_id", [](const KinetoEvent& e) { return e.deviceResourceId(); }},
      {"correlation_id", [](const KinetoEvent& e) { return static_cast<int64_t>(e.correlationId()); }},
      {"linked_correlation_id",
       [](const KinetoEvent& e) { return static_cast<int64_t>(e.linkedCorrelationId()); }},
      {"is_async", [](const KinetoEvent& e) { return static_cast<int64_t>(e.isAsync()); }},
      {"flops", [](const KinetoEvent& e) { return static_cast<int64_t>(e.flops()); }},
      {"nbytes", [](const KinetoEvent& e) { return e.nBytes(); }},
      {"is_user_annotation",
       [](const KinetoEvent& e) {
         const uint8_t type = e.activityType();
         return static_cast<int64_t>(type == kUserAnnotation || type == kGpuUserAnnotation);
       }},
      // How many entries a row's structured metadata has: the decoder reads the (rare) non-empty
      // ones through torch's Python accessors.
      {"extra_meta_size", [](const KinetoEvent& e) { return static_cast<int64_t>(e.extraMeta().size()); }},
#ifdef POLYPROF_HAS_typed_metadata
      {"typed_metadata_size",
       [](const KinetoEvent& e) { return static_cast<int64_t>(e.typedMetadata().size()); }},
#endif
#ifdef POLYPROF_HAS_is_python_function
      {"is_python_function", [](const KinetoEvent& e) { return static_cast<int64_t>(e.isPythonFunction()); }},
#endif
#ifdef POLYPROF_HAS_is_hidden_event
      {"is_hidden_event", [](const KinetoEvent& e) { return static_cast<int64_t>(e.isHiddenEvent()); }},
#endif
#ifdef POLYPROF_HAS_flow_id
      {"flow_id", [](const KinetoEvent& e) { return static_cast<int64_t>(e.flowId()); }},
      {"flow_type", [](const KinetoEvent& e) { return static_cast<int64_t>(e.flowType()); }},
      {"flow_start", [](const KinetoEvent& e) { return static_cast<int64_t>(e.flowStart()); }},
#endif
#ifdef POLYPROF_HAS_external_id
      {"external_id", [](const KinetoEvent& e) { return e.externalId(); }},
#endif
#ifdef POLYPROF_HAS_python_id
      {"python_id", [](const KinetoEvent& e) { return e.pythonId(); }},
      {"python_parent_id", [](const KinetoEvent& e) { return e.pythonParentId(); }},
#endif
#ifdef POLYPROF_HAS_python_module_id
      {"python_module_id", [](const KinetoEvent& e) { return e.pythonModuleId(); }},
#endif
  };
  return table;
}

const std::vector<KinetoEvent>& events_of(const py::object& result) {
  return result.cast<ProfilerResult*>()->events();
}

// The rows to read: every event (rows is None) or the int64 indices in ``rows``, each checked.
struct Rows {
  const int64_t* indices = nullptr;
  size_t count = 0;
  bool all = true;

  Rows(const py::object& rows, size_t n_events) {
    if (rows.is_none()) {
      count = n_events;
      return;
    }
    py::buffer_info info = py::buffer(rows).request();
    // numpy's int64 is "l" on LP64 platforms, "q" elsewhere
    if (info.itemsize != 8 || (info.format != "l" && info.format != "q") || info.ndim != 1 ||
        info.strides[0] != 8) {
      throw std::invalid_argument("rows must be a contiguous one-dimensional int64 array");
    }
    all = false;
    indices = static_cast<const int64_t*>(info.ptr);
    count = static_cast<size_t>(info.shape[0]);
    for (size_t i = 0; i < count; ++i) {
      if (indices[i] < 0 || static_cast<size_t>(indices[i]) >= n_events) {
        throw std::out_of_range("row index " + std::to_string(indices[i]) + " is outside the " +
                                std::to_string(n_events) + " events of the result");
      }
    }
  }

  size_t at(size_t i) const {
    return all ? i : static_cast<size_t>(indices[i]);
  }
};

template <typename T>
T* writable(const py::object& out, size_t count, const char* what) {
  py::buffer_info info = py::buffer(out).request(/*writable=*/true);
  if (info.itemsize != sizeof(T) || info.ndim != 1 || info.strides[0] != sizeof(T) ||
      static_cast<size_t>(info.shape[0]) != count) {
    throw std::invalid_argument(std::string(what) + " must be a contiguous one-dimensional array of " +
                                std::to_string(count) + " items of " + std::to_string(sizeof(T)) +
                                " bytes");
  }
  return static_cast<T*>(info.ptr);
}

size_t event_count(const py::object& result) {
  return events_of(result).size();
}

py::list field_names() {
  py::list names;
  for (const auto& item : fields()) {
    names.append(py::str(item.first));
  }
  return names;
}

// Fills ``out`` (int64, one per row) with ``field`` of each row.
void fill(const py::object& result, const std::string& field, const py::object& rows, const py::object& out) {
  const auto found = fields().find(field);
  if (found == fields().end()) {
    throw std::invalid_argument("the compiled reader has no field '" + field + "'");
  }
  const auto& events = events_of(result);
  const Rows picked(rows, events.size());
  int64_t* values = writable<int64_t>(out, picked.count, "out");
  const Field& read = found->second;
  // Nothing changes the events while this reads them: release() empties only a result nothing
  // else refers to, and release_trace() touches only the Kineto trace.
  py::gil_scoped_release unlocked;
  for (size_t i = 0; i < picked.count; ++i) {
    values[i] = read(events[picked.at(i)]);
  }
}

// Interns ``which`` ("name", "overload_name", "metadata_json" or "activity_type") of each row: fills ``out`` (int32) with indices
// into the returned table, in order of first appearance. A text that is not valid UTF-8 (torch
// sometimes reads frame names from freed memory) becomes ``undecodable``; returns
// (table, how many rows had such a text).
py::tuple intern_texts(
    const py::object& result,
    const std::string& which,
    const py::object& rows,
    const py::object& out,
    const std::string& undecodable) {
  std::function<std::string(const KinetoEvent&)> text;
  if (which == "name") {
    text = [](const KinetoEvent& e) { return e.name(); };
#ifdef POLYPROF_HAS_overload_name
  } else if (which == "overload_name") {
    text = [](const KinetoEvent& e) { return e.overload_name(); };
#endif
#ifdef POLYPROF_HAS_metadata_json
  } else if (which == "metadata_json") {
    text = [](const KinetoEvent& e) { return e.metadataJson(); };
#endif
#ifdef POLYPROF_HAS_activity_type
  } else if (which == "activity_type") {
    // Kineto's name of the type, as torch's activity_type() gives it
    text = [](const KinetoEvent& e) {
      return std::string(libkineto::toString(static_cast<libkineto::ActivityType>(e.activityType())));
    };
#endif
  } else {
    throw std::invalid_argument("the compiled reader cannot intern '" + which + "'");
  }
  const auto& events = events_of(result);
  const Rows picked(rows, events.size());
  int32_t* indices = writable<int32_t>(out, picked.count, "out");
  std::unordered_map<std::string, int32_t> index_of;
  std::vector<std::string> order;
  {
    py::gil_scoped_release unlocked;
    for (size_t i = 0; i < picked.count; ++i) {
      std::string value = text(events[picked.at(i)]);
      auto [slot, added] = index_of.try_emplace(std::move(value), static_cast<int32_t>(order.size()));
      if (added) {
        order.push_back(slot->first);
      }
      indices[i] = slot->second;
    }
  }
  // Decode each distinct text once; undecodable ones share one entry, placed where the first of
  // them appeared, as the Python path's interner places it.
  std::vector<int32_t> remap(order.size());
  py::list table;
  int32_t undecodable_index = -1;
  for (size_t k = 0; k < order.size(); ++k) {
    PyObject* decoded = PyUnicode_DecodeUTF8(order[k].data(), static_cast<Py_ssize_t>(order[k].size()), "strict");
    if (decoded == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        throw py::error_already_set();
      }
      PyErr_Clear();
      if (undecodable_index < 0) {
        undecodable_index = static_cast<int32_t>(py::len(table));
        table.append(py::str(undecodable));
      }
      remap[k] = undecodable_index;
      continue;
    }
    remap[k] = static_cast<int32_t>(py::len(table));
    table.append(py::reinterpret_steal<py::object>(decoded));
  }
  size_t bad = 0;
  for (size_t i = 0; i < picked.count; ++i) {
    const int32_t first = indices[i];
    indices[i] = remap[first];
    if (remap[first] == undecodable_index) {
      ++bad;
    }
  }
  return py::make_tuple(py::tuple(table), bad);
}

#ifdef POLYPROF_HAS_result_members
// torch's result keeps its Kineto trace in a private member with no accessor. An explicit
// instantiation may name a private member (C++ [temp.spec]); this one hands release() a pointer to
// it. Defined only where the build found the member in the installed torch's header.
using TraceHolder = std::unique_ptr<torch::profiler::impl::kineto::ActivityTraceWrapper>;
struct TraceMember {
  using type = TraceHolder ProfilerResult::*;
  friend type member_of(TraceMember);
};
template <typename Tag, typename Tag::type Member>
struct Expose {
  friend typename Tag::type member_of(Tag) {
    return Member;
  }
};
template struct Expose<TraceMember, &ProfilerResult::trace_>;
#endif

bool can_release() {
#ifdef POLYPROF_HAS_result_members
  return true;
#else
  return false;
#endif
}

#ifdef POLYPROF_HAS_result_members
// Orders the moves out of results: polyprof's Python side already waits for release_trace()'s
// thread before release(), and this keeps two moves from ever interleaving regardless.
std::mutex& member_moves_mutex() {
  static std::mutex lock;
  return lock;
}
#endif

#ifdef POLYPROF_HAS_result_members
// Moves what release() and release_trace() free out of ``result`` into an empty result, whose
// destructor is torch's own (it knows the Kineto trace's type, which this header only declares),
// and frees it with the GIL released. const_cast: the members are not const, only the accessors'
// views of them.
void free_without_gil(const py::object& result, bool everything) {
  ProfilerResult* held = result.cast<ProfilerResult*>();
  py::gil_scoped_release unlocked;
  ProfilerResult sink;  // destroyed before the GIL is taken back
  std::lock_guard<std::mutex> moving(member_moves_mutex());
  if (everything) {
    const_cast<std::vector<KinetoEvent>&>(sink.events())
        .swap(const_cast<std::vector<KinetoEvent>&>(held->events()));
    using Tree = std::vector<torch::autograd::profiler::experimental_event_t>;
    const_cast<Tree&>(sink.event_tree()).swap(const_cast<Tree&>(held->event_tree()));
  }
  (sink.*member_of(TraceMember())).swap(held->*member_of(TraceMember()));
}
#endif

// Frees what torch's result holds (its events, its event tree and its Kineto trace) without the
// GIL, so a Python thread can free it beside other work. The result is left empty: call this only
// on a result nothing else refers to. Deallocating it through Python holds the GIL throughout,
// about 0.5 us per event.
void release(const py::object& result) {
#ifdef POLYPROF_HAS_result_members
  free_without_gil(result, /*everything=*/true);
#else
  (void)result;
  throw std::logic_error("this build cannot release torch's result (its members were not found)");
#endif
}

// Frees only the result's Kineto trace, without the GIL (about half of what the result holds).
// Its events and event tree do not point into it once torch's post-processing is over (torch
// clears each Result's kineto_activity_ then), so they stay readable; what needs the trace,
// save() and trace_activities(), must not be called afterwards.
void release_trace(const py::object& result) {
#ifdef POLYPROF_HAS_result_members
  free_without_gil(result, /*everything=*/false);
#else
  (void)result;
  throw std::logic_error("this build cannot release torch's Kineto trace (its members were not found)");
#endif
}

}  // namespace

namespace polyprof_chrome_lines {
void register_chrome_lines(py::module_& module);  // chrome_lines.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "polyprof's compiled reader of torch's raw profiler result";
  m.def("event_count", &event_count, "How many events torch's result holds.");
  m.def("field_names", &field_names, "The fields fill() reads in this build.");
  m.def("fill", &fill, py::arg("result"), py::arg("field"), py::arg("rows"), py::arg("out"));
  m.def("intern_texts", &intern_texts, py::arg("result"), py::arg("which"), py::arg("rows"), py::arg("out"),
        py::arg("undecodable"));
  m.def("can_release", &can_release, "Whether release() is built for this torch.");
  m.def("release", &release, py::arg("result"),
        "Free what torch's result holds without the GIL; only for a result nothing else refers to.");
  m.def("release_trace", &release_trace, py::arg("result"),
        "Free the Kineto trace of torch's result without the GIL; save() must not follow.");
  polyprof_chrome_lines::register_chrome_lines(m);
}
