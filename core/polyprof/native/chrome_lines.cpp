// polyprof's compiled formatter of Chrome trace lines (polyprof.runtime.chrome_trace).
//
// The exporter describes a chunk of events as a list of segments, each a piece of every row's
// text: a literal, an int64 column written in decimal (as Python's str(int) writes it), a column
// of 0..999 written as three digits, or a column of indices into a table of byte strings. Each
// segment may carry a mask: it is written only in the rows where the mask is set. The rows'
// texts are concatenated in row order into one bytes object. Python's f-strings build the same
// text where this module is not built, and the tests compare both.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace polyprof_chrome_lines {
namespace {

enum Kind : int { kLiteral = 0, kInteger = 1, kMillis = 2, kTable = 3 };

// A one-dimensional contiguous array of ``count`` items of ``T`` (numpy's int64, or bool/uint8).
template <typename T>
const T* column_of(const py::buffer_info& info, size_t count, const char* what, bool integer) {
  const bool int64_format = info.format == "l" || info.format == "q";
  const bool byte_format = info.format == "?" || info.format == "B" || info.format == "b";
  if (info.itemsize != sizeof(T) || info.ndim != 1 || static_cast<size_t>(info.shape[0]) != count ||
      (count > 0 && info.strides[0] != static_cast<py::ssize_t>(sizeof(T))) ||
      (integer ? !int64_format : !byte_format)) {
    throw std::invalid_argument(std::string(what) + " must be a contiguous one-dimensional array of " +
                                std::to_string(count) + (integer ? " int64" : " bool") + " items");
  }
  return static_cast<const T*>(info.ptr);
}

// A view of an immutable Python bytes object, which the segment's table list keeps alive.
struct Text {
  const char* data;
  size_t size;
};

struct Segment {
  int kind = kLiteral;
  std::string literal;
  py::object table_holder;  // the tuple of bytes the views point into
  std::vector<Text> table;
  const int64_t* values = nullptr;
  const uint8_t* mask = nullptr;
  // The buffer views keep numpy's arrays alive and unmoved; released with the GIL held.
  std::unique_ptr<py::buffer_info> values_view;
  std::unique_ptr<py::buffer_info> mask_view;

  bool written(size_t row) const {
    return mask == nullptr || mask[row] != 0;
  }
};

size_t decimal_digits(uint64_t magnitude) {
  size_t digits = 1;
  while (magnitude >= 10) {
    magnitude /= 10;
    ++digits;
  }
  return digits;
}

uint64_t magnitude_of(int64_t value) {
  // -INT64_MIN overflows int64; its magnitude fits uint64
  return value < 0 ? uint64_t(0) - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
}

size_t integer_length(int64_t value) {
  return decimal_digits(magnitude_of(value)) + (value < 0 ? 1 : 0);
}

char* write_integer(char* out, int64_t value) {
  uint64_t magnitude = magnitude_of(value);
  if (value < 0) {
    *out++ = '-';
  }
  const size_t digits = decimal_digits(magnitude);
  char* end = out + digits;
  char* at = end;
  do {
    *--at = static_cast<char>('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude != 0);
  return end;
}

std::vector<Segment> parse(const py::list& segments, size_t count) {
  std::vector<Segment> parsed;
  parsed.reserve(py::len(segments));
  for (const py::handle& item : segments) {
    const py::tuple spec = py::reinterpret_borrow<py::tuple>(item);
    if (spec.size() != 4) {
      throw std::invalid_argument("a segment is (kind, values, table, mask)");
    }
    Segment segment;
    segment.kind = spec[0].cast<int>();
    if (segment.kind == kLiteral) {
      segment.literal = spec[1].cast<std::string>();
    } else if (segment.kind == kInteger || segment.kind == kMillis || segment.kind == kTable) {
      segment.values_view = std::make_unique<py::buffer_info>(py::buffer(spec[1]).request());
      segment.values = column_of<int64_t>(*segment.values_view, count, "a segment's values", true);
      if (segment.kind == kTable) {
        segment.table_holder = py::tuple(spec[2]);  // a copy, which no one else can change
        for (const py::handle& text : segment.table_holder) {
          if (!PyBytes_Check(text.ptr())) {
            throw std::invalid_argument("a table holds bytes only");
          }
          segment.table.push_back({PyBytes_AS_STRING(text.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(text.ptr()))});
        }
      }
    } else {
      throw std::invalid_argument("a segment's kind is 0 (literal), 1 (integer), 2 (milliseconds) or 3 (table), not " +
                                  std::to_string(segment.kind));
    }
    if (!spec[3].is_none()) {
      segment.mask_view = std::make_unique<py::buffer_info>(py::buffer(spec[3]).request());
      segment.mask = column_of<uint8_t>(*segment.mask_view, count, "a segment's mask", false);
    }
    parsed.push_back(std::move(segment));
  }
  return parsed;
}

// The length of every row's text together; checks every value it will write.
size_t total_length(const std::vector<Segment>& segments, size_t count) {
  size_t total = 0;
  for (const Segment& segment : segments) {
    for (size_t row = 0; row < count; ++row) {
      if (!segment.written(row)) {
        continue;
      }
      switch (segment.kind) {
        case kLiteral:
          total += segment.literal.size();
          break;
        case kInteger:
          total += integer_length(segment.values[row]);
          break;
        case kMillis:
          if (segment.values[row] < 0 || segment.values[row] > 999) {
            throw std::out_of_range("a three-digit value is " + std::to_string(segment.values[row]));
          }
          total += 3;
          break;
        default: {
          const int64_t index = segment.values[row];
          if (index < 0 || static_cast<size_t>(index) >= segment.table.size()) {
            throw py::index_error("table index " + std::to_string(index) + " is outside a table of " +
                                  std::to_string(segment.table.size()));
          }
          total += segment.table[static_cast<size_t>(index)].size;
        }
      }
    }
  }
  return total;
}

// Writes what total_length() measured; checks each value again, since another thread could change
// a caller's array between the passes (the GIL is released for both), and never writes past end.
void write_rows(const std::vector<Segment>& segments, size_t count, char* out, const char* end) {
  const auto room_for = [&](size_t size) {
    if (static_cast<size_t>(end - out) < size) {
      throw std::runtime_error("a column changed while its rows were written");
    }
  };
  for (size_t row = 0; row < count; ++row) {
    for (const Segment& segment : segments) {
      if (!segment.written(row)) {
        continue;
      }
      switch (segment.kind) {
        case kLiteral:
          room_for(segment.literal.size());
          std::memcpy(out, segment.literal.data(), segment.literal.size());
          out += segment.literal.size();
          break;
        case kInteger: {
          const int64_t value = segment.values[row];  // read once: measured and written alike
          room_for(integer_length(value));
          out = write_integer(out, value);
          break;
        }
        case kMillis: {
          const int64_t value = segment.values[row];
          if (value < 0 || value > 999) {
            throw std::runtime_error("a column changed while its rows were written");
          }
          room_for(3);
          out[0] = static_cast<char>('0' + value / 100);
          out[1] = static_cast<char>('0' + value / 10 % 10);
          out[2] = static_cast<char>('0' + value % 10);
          out += 3;
          break;
        }
        default: {
          const int64_t index = segment.values[row];
          if (index < 0 || static_cast<size_t>(index) >= segment.table.size()) {
            throw std::runtime_error("a column changed while its rows were written");
          }
          const Text& text = segment.table[static_cast<size_t>(index)];
          room_for(text.size);
          std::memcpy(out, text.data, text.size);
          out += text.size;
        }
      }
    }
  }
  if (out != end) {
    throw std::runtime_error("a column changed while its rows were written");
  }
}

// Every row's text, in row order, as one bytes object.
py::bytes format_rows(size_t count, const py::list& segments) {
  std::vector<Segment> parsed = parse(segments, count);
  size_t total = 0;
  {
    py::gil_scoped_release unlocked;  // the arrays stay alive: parsed holds views of them
    total = total_length(parsed, count);
  }
  PyObject* text = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(total));
  if (text == nullptr) {
    throw py::error_already_set();
  }
  py::bytes result = py::reinterpret_steal<py::bytes>(text);
  {
    py::gil_scoped_release unlocked;  // nothing else sees the new bytes object yet
    write_rows(parsed, count, PyBytes_AS_STRING(text), PyBytes_AS_STRING(text) + total);
  }
  return result;
}

}  // namespace

void register_chrome_lines(py::module_& module) {
  module.def("format_rows", &format_rows, py::arg("count"), py::arg("segments"),
             "The text of count rows, each the concatenation of the segments written in it.");
}

}  // namespace polyprof_chrome_lines
