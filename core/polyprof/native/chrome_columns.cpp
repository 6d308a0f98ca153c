// polyprof's compiled builder of Parquet trace columns from Chrome trace JSON (polyprof.native_columns).
//
// columns(data) reads the bytes of a Chrome trace file and returns the columns that
// polyprof.columnar's Python builder makes from the document orjson parses out of the same bytes
// (orjson.loads, then one pass over the events), without a Python object per event. Every column
// holds what the Python builder puts there: a string decoded as orjson decodes it, a number as
// orjson parses it, ``args`` and ``extra`` written as orjson.dumps writes the parsed value (no
// spaces, the shortest float that reads back, ``"`` ``\`` and control characters escaped, all else
// as UTF-8). The top-level keys around ``traceEvents`` are left to the caller, which parses them
// with orjson (with ``traceEvents`` emptied), and so checks the bytes outside the events.
//
// Whatever this module does not reproduce exactly is refused, and the caller then takes the
// Python path on the whole file: what orjson refuses (invalid JSON or UTF-8, lone surrogates,
// numbers past a double's range), integers past int64 (which orjson reads as big ints or floats),
// duplicate keys in an object, nesting past kMaxDepth, an element of ``traceEvents`` that is not
// an object, a ``traceEvents`` that is not an array or that appears twice. The refusal is a string
// that says why; tests/test_native_columns.py compares both builders.
//
// Plain CPython API, no torch: it loads wherever Python does (Python 3.10 to 3.13).

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <new>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

// Deeper nesting goes to the Python path (orjson.dumps refuses past 254 levels, loads past 1024).
constexpr int kMaxDepth = 64;
// Objects with more keys than this look for duplicates in a hash set instead of by comparison.
constexpr size_t kLinearKeys = 24;
constexpr int64_t kExactInDouble = int64_t{1} << 53;

struct Refused {
  const char* reason;
  size_t at;
};

[[noreturn]] void refuse(const char* reason, size_t at) {
  throw Refused{reason, at};
}

// A growable byte buffer: std::string's appends, without its per-call overhead on the many short
// pieces a column's text is made of (realloc may also move a large buffer without copying it).
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data_); }

  size_t size() const { return size_; }
  const char* data() const { return data_ == nullptr ? "" : data_; }
  void clear() { size_ = 0; }
  void reserve(size_t capacity) {
    if (capacity > capacity_) grow(capacity);
  }
  void push_back(char c) {
    if (size_ == capacity_) grow(size_ + 1);
    data_[size_++] = c;
  }
  void append(const char* text, size_t count) {
    if (size_ + count > capacity_) grow(size_ + count);
    if (count > 0) std::memcpy(data_ + size_, text, count);
    size_ += count;
  }
  void append(const char* text) { append(text, std::strlen(text)); }
  void append(size_t count, char c) {
    if (size_ + count > capacity_) grow(size_ + count);
    if (count > 0) std::memset(data_ + size_, c, count);
    size_ += count;
  }
  bool equals(const char* text) const {
    const size_t count = std::strlen(text);
    return count == size_ && (count == 0 || std::memcmp(data_, text, count) == 0);
  }
  std::string substr(size_t begin, size_t count) const { return std::string(data_ + begin, count); }

 private:
  void grow(size_t needed) {
    const size_t capacity = std::max(needed, capacity_ * 2 + 64);
    void* moved = std::realloc(data_, capacity);
    if (moved == nullptr) throw std::bad_alloc();
    data_ = static_cast<char*>(moved);
    capacity_ = capacity;
  }

  char* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// One string column: UTF-8 text per row, or null.
struct TextColumn {
  Buffer data;
  std::vector<int64_t> offsets{0};
  std::vector<uint8_t> valid;
  bool set = false;

  void end_row() {
    offsets.push_back(static_cast<int64_t>(data.size()));
    valid.push_back(set ? 1 : 0);
    set = false;
  }
};

// One number column (int64 or float64 values), or null.
template <typename T>
struct NumberColumn {
  std::vector<T> values;
  std::vector<uint8_t> valid;
  bool set = false;
  T value{};

  void end_row() {
    values.push_back(set ? value : T{});
    valid.push_back(set ? 1 : 0);
    set = false;
    value = T{};
  }
};

// The event keys that have a column; bit i of an event's mask is set once key i is seen.
enum Key : int { kPh, kCat, kName, kPid, kTid, kTs, kDur, kId, kArgs, kOther };

Key key_of(const char* text, size_t size) {
  switch (size) {
    case 2:
      if (text[0] == 'p' && text[1] == 'h') return kPh;
      if (text[0] == 't' && text[1] == 's') return kTs;
      if (text[0] == 'i' && text[1] == 'd') return kId;
      return kOther;
    case 3:
      if (std::memcmp(text, "cat", 3) == 0) return kCat;
      if (std::memcmp(text, "pid", 3) == 0) return kPid;
      if (std::memcmp(text, "tid", 3) == 0) return kTid;
      if (std::memcmp(text, "dur", 3) == 0) return kDur;
      return kOther;
    case 4:
      if (std::memcmp(text, "name", 4) == 0) return kName;
      if (std::memcmp(text, "args", 4) == 0) return kArgs;
      return kOther;
    default:
      return kOther;
  }
}

// A parsed JSON number: an int64, or a double (a token with a fraction or an exponent).
struct Number {
  bool is_int;
  int64_t integer;
  double real;
  size_t begin;
  size_t end;
};

const char kHex[] = "0123456789abcdef";

// The bytes a string holds as they are: not a quote, a backslash, a control character or past ASCII.
struct PlainBytes {
  bool plain[256];
  constexpr PlainBytes() : plain() {
    for (int c = 0; c < 256; ++c) plain[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
  }
};
constexpr PlainBytes kPlain;

inline bool is_plain(char c) {
  return kPlain.plain[static_cast<unsigned char>(c)];
}

// The keys of one object being read, to refuse duplicates (which orjson collapses into one). Each
// key is compared as its canonical JSON text in the output buffer, the same for two spellings of
// one key; past kLinearKeys keys they go to a hash set.
class KeySet {
 public:
  void clear() {
    spans_.clear();
    hashed_.clear();
  }

  // False when the key at ``buffer[begin:begin + size]`` was already in the object.
  bool insert(const Buffer& buffer, size_t begin, size_t size) {
    if (!hashed_.empty()) return hashed_.insert(buffer.substr(begin, size)).second;
    for (const auto& span : spans_) {
      if (span.second == size && std::memcmp(buffer.data() + span.first, buffer.data() + begin, size) == 0) {
        return false;
      }
    }
    if (spans_.size() >= kLinearKeys) {
      for (const auto& span : spans_) hashed_.insert(buffer.substr(span.first, span.second));
      hashed_.insert(buffer.substr(begin, size));
      spans_.clear();
      return true;
    }
    spans_.emplace_back(begin, size);
    return true;
  }

 private:
  std::vector<std::pair<size_t, size_t>> spans_;
  std::unordered_set<std::string> hashed_;
};

class Scanner {
 public:
  // One key set per nesting depth, made up front: a reference to one stays valid while deeper
  // values are read.
  Scanner(const char* data, size_t size) : p_(data), n_(size), key_sets_(kMaxDepth + 2) {}

  // Room for the rows and text of a trace of n_ bytes (Kineto's events take 130 bytes and more), so
  // that the columns are seldom copied as they grow; the pages are only used where written.
  void reserve() {
    const size_t rows = n_ / 128 + 16;
    for (TextColumn* column : {&ph, &cat, &name, &pid_label, &tid_label, &id_label, &args, &extra}) {
      column->offsets.reserve(rows + 1);
      column->valid.reserve(rows);
    }
    for (auto* column : {&pid, &tid, &id}) {
      column->values.reserve(rows);
      column->valid.reserve(rows);
    }
    for (auto* column : {&ts, &dur}) {
      column->values.reserve(rows);
      column->valid.reserve(rows);
    }
    ph.data.reserve(rows * 2);
    args.data.reserve(n_ / 2 + 16);
  }

  const char* p_;
  size_t n_;
  size_t i_ = 0;
  std::vector<KeySet> key_sets_;  // one per nesting depth
  Buffer scratch_;
  const char* key_text_ = nullptr;  // the event key being read, decoded
  size_t key_size_ = 0;

  TextColumn ph, cat, name, pid_label, tid_label, id_label, args, extra;
  NumberColumn<int64_t> pid, tid, id;
  NumberColumn<double> ts, dur;
  size_t rows = 0;
  size_t events_begin = 0;
  size_t events_end = 0;

  // ------------------------------------------------------------ lexing

  void skip_ws() {
    while (i_ < n_) {
      const char c = p_[i_];
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
        ++i_;
      } else {
        return;
      }
    }
  }

  char peek() {
    if (i_ >= n_) refuse("the document ends early", i_);
    return p_[i_];
  }

  void expect(char c) {
    if (i_ >= n_ || p_[i_] != c) refuse("invalid JSON", i_);
    ++i_;
  }

  // Validates one UTF-8 sequence starting at i_ (a byte >= 0x80) as orjson does; returns its length.
  size_t utf8_length() {
    const auto* u = reinterpret_cast<const unsigned char*>(p_);
    const unsigned char b0 = u[i_];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;  // no UTF-8 encoded surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      refuse("invalid UTF-8", i_);
    }
    if (i_ + len > n_) refuse("invalid UTF-8", i_);
    if (u[i_ + 1] < lo || u[i_ + 1] > hi) refuse("invalid UTF-8", i_);
    for (size_t k = 2; k < len; ++k) {
      if (u[i_ + k] < 0x80 || u[i_ + k] > 0xBF) refuse("invalid UTF-8", i_);
    }
    return len;
  }

  unsigned hex4() {
    if (i_ + 4 > n_) refuse("invalid \\u escape", i_);
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = p_[i_ + k];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        refuse("invalid \\u escape", i_);
      }
    }
    i_ += 4;
    return v;
  }

  static void put_utf8(Buffer& out, unsigned cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // A character as orjson.dumps writes it inside a string (``cp`` < 0x80).
  static void put_escaped_ascii(Buffer& out, unsigned cp) {
    switch (cp) {
      case '"': out.append("\\\""); return;
      case '\\': out.append("\\\\"); return;
      case '\b': out.append("\\b"); return;
      case '\f': out.append("\\f"); return;
      case '\n': out.append("\\n"); return;
      case '\r': out.append("\\r"); return;
      case '\t': out.append("\\t"); return;
      default:
        if (cp < 0x20) {
          out.append("\\u00");
          out.push_back(kHex[cp >> 4]);
          out.push_back(kHex[cp & 0xF]);
        } else {
          out.push_back(static_cast<char>(cp));
        }
    }
  }

  // Reads a string (i_ at its opening quote). JSON = true: appends it to ``out`` as orjson.dumps
  // writes it, quotes included; else appends its decoded text. Returns whether it had escapes.
  template <bool JSON>
  bool string(Buffer& out) {
    ++i_;  // the opening quote
    if (JSON) out.push_back('"');
    bool escaped = false;
    for (;;) {
      size_t run = i_;
      while (run < n_ && is_plain(p_[run])) ++run;
      out.append(p_ + i_, run - i_);
      i_ = run;
      if (i_ >= n_) refuse("the document ends inside a string", i_);
      const auto c = static_cast<unsigned char>(p_[i_]);
      if (c == '"') {
        ++i_;
        if (JSON) out.push_back('"');
        return escaped;
      }
      if (c < 0x20) refuse("a control character in a string", i_);
      if (c >= 0x80) {
        const size_t len = utf8_length();
        out.append(p_ + i_, len);
        i_ += len;
        continue;
      }
      // a backslash
      escaped = true;
      ++i_;
      if (i_ >= n_) refuse("the document ends inside a string", i_);
      const char e = p_[i_++];
      unsigned cp;
      switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
          cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) refuse("a lone low surrogate", i_);
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (i_ + 2 > n_ || p_[i_] != '\\' || p_[i_ + 1] != 'u') refuse("a lone high surrogate", i_);
            i_ += 2;
            const unsigned low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) refuse("a lone high surrogate", i_);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          break;
        }
        default:
          refuse("an invalid escape in a string", i_);
      }
      if (JSON && cp < 0x80) {
        put_escaped_ascii(out, cp);
      } else {
        put_utf8(out, cp);
      }
    }
  }

  // Reads a number token as orjson does; refuses what it would not give as an int64 or a finite double.
  Number number() {
    Number num{false, 0, 0.0, i_, i_};
    size_t j = i_;
    const bool negative = j < n_ && p_[j] == '-';
    if (negative) ++j;
    if (j >= n_ || p_[j] < '0' || p_[j] > '9') refuse("invalid number", j);
    uint64_t magnitude = 0;  // of the integer part's first 19 digits, which a uint64 holds
    const size_t digits_begin = j;
    if (p_[j] == '0') {
      ++j;
      if (j < n_ && p_[j] >= '0' && p_[j] <= '9') refuse("a number with a leading zero", j);
    } else {
      while (j < n_ && p_[j] >= '0' && p_[j] <= '9') {
        magnitude = magnitude * 10 + static_cast<uint64_t>(p_[j] - '0');
        ++j;
      }
    }
    const bool too_big = j - digits_begin > 19;
    bool real = false;
    if (j < n_ && p_[j] == '.') {
      real = true;
      ++j;
      if (j >= n_ || p_[j] < '0' || p_[j] > '9') refuse("no digit after a decimal point", j);
      while (j < n_ && p_[j] >= '0' && p_[j] <= '9') ++j;
    }
    if (j < n_ && (p_[j] == 'e' || p_[j] == 'E')) {
      real = true;
      ++j;
      if (j < n_ && (p_[j] == '+' || p_[j] == '-')) ++j;
      if (j >= n_ || p_[j] < '0' || p_[j] > '9') refuse("no digit in an exponent", j);
      while (j < n_ && p_[j] >= '0' && p_[j] <= '9') ++j;
    }
    num.end = j;
    if (!real) {
      if (too_big) refuse("an integer past int64", i_);  // orjson: a float, or an int past int64
      const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
      if (magnitude > limit) refuse("an integer past int64", i_);  // orjson: an int past int64
      num.is_int = true;
      num.integer = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
    } else {
      // from_chars takes no leading '+' and no "E+": the token has neither before the exponent.
      const auto parsed = std::from_chars(p_ + i_, p_ + j, num.real);
      if (parsed.ec != std::errc() || parsed.ptr != p_ + j) {
        refuse("a number out of a double's range", i_);  // orjson refuses overflow; underflow is rare
      }
    }
    i_ = j;
    return num;
  }

  // An int64 as Python's str(int) writes it.
  static void put_int(Buffer& out, int64_t value) {
    char buffer[24];
    const auto written = std::to_chars(buffer, buffer + sizeof buffer, value);
    out.append(buffer, static_cast<size_t>(written.ptr - buffer));
  }

  // A finite double as orjson.dumps writes it: the shortest digits that read back, in positional
  // notation from 1e-5 up to below 1e16 (with ".0" when whole), else as d[.ddd]e+X / d[.ddd]e-X.
  static void put_double(Buffer& out, double value) {
    if (value == 0.0) {
      out.append(std::signbit(value) ? "-0.0" : "0.0");
      return;
    }
    char buffer[40];
    const auto written = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
    // buffer: [-]d[.ddd]e(+|-)XX
    const char* s = buffer;
    const char* end = written.ptr;
    if (*s == '-') {
      out.push_back('-');
      ++s;
    }
    char digits[20];
    int count = 0;
    const char* c = s;
    for (; c < end && *c != 'e'; ++c) {
      if (*c != '.') digits[count++] = *c;
    }
    int exponent = 0;
    std::from_chars(c + 1 + (c[1] == '+' ? 1 : 0), end, exponent);
    const int kk = exponent + 1;  // 10^(kk-1) <= |value| < 10^kk
    if (kk > 0 && kk <= 16) {
      if (count <= kk) {
        out.append(digits, static_cast<size_t>(count));
        out.append(static_cast<size_t>(kk - count), '0');
        out.append(".0");
      } else {
        out.append(digits, static_cast<size_t>(kk));
        out.push_back('.');
        out.append(digits + kk, static_cast<size_t>(count - kk));
      }
    } else if (kk > -5 && kk <= 0) {
      out.append("0.");
      out.append(static_cast<size_t>(-kk), '0');
      out.append(digits, static_cast<size_t>(count));
    } else {
      out.push_back(digits[0]);
      if (count > 1) {
        out.push_back('.');
        out.append(digits + 1, static_cast<size_t>(count - 1));
      }
      out.push_back('e');
      out.push_back(exponent < 0 ? '-' : '+');
      put_int(out, exponent < 0 ? -exponent : exponent);
    }
  }

  void literal(Buffer& out) {
    static const char* const kWords[] = {"true", "false", "null"};
    for (const char* word : kWords) {
      const size_t len = std::strlen(word);
      if (i_ + len <= n_ && std::memcmp(p_ + i_, word, len) == 0) {
        out.append(word, len);
        i_ += len;
        return;
      }
    }
    refuse("invalid JSON", i_);
  }

  KeySet& keys_at(int depth) {
    KeySet& keys = key_sets_[static_cast<size_t>(depth)];
    keys.clear();
    return keys;
  }

  // Reads any value and appends it to ``out`` as orjson.dumps writes the parsed value.
  void value(Buffer& out, int depth) {
    if (depth > kMaxDepth) refuse("nested too deeply for the compiled builder", i_);
    const char c = peek();
    if (c == '"') {
      string<true>(out);
    } else if (c == '{') {
      ++i_;
      out.push_back('{');
      skip_ws();
      if (peek() == '}') {
        ++i_;
        out.push_back('}');
        return;
      }
      KeySet& keys = keys_at(depth);
      for (bool first = true;; first = false) {
        if (!first) out.push_back(',');
        skip_ws();
        if (peek() != '"') refuse("an object key that is not a string", i_);
        const size_t key_start = out.size();
        string<true>(out);
        if (!keys.insert(out, key_start, out.size() - key_start)) refuse("a duplicate key in an object", i_);
        skip_ws();
        expect(':');
        out.push_back(':');
        skip_ws();
        value(out, depth + 1);
        skip_ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        out.push_back('}');
        return;
      }
    } else if (c == '[') {
      ++i_;
      out.push_back('[');
      skip_ws();
      if (peek() == ']') {
        ++i_;
        out.push_back(']');
        return;
      }
      for (bool first = true;; first = false) {
        if (!first) out.push_back(',');
        skip_ws();
        value(out, depth + 1);
        skip_ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        out.push_back(']');
        return;
      }
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const Number num = number();
      if (num.is_int) {
        if (num.integer == 0) {
          out.push_back('0');  // "-0" is the int 0
        } else {
          out.append(p_ + num.begin, num.end - num.begin);  // as Python writes it: no '+', no leading 0
        }
      } else {
        put_double(out, num.real);
      }
    } else {
      literal(out);
    }
  }

  // Skips a value at the top level: its bytes are checked by orjson afterwards, so this only has to
  // find where a valid value ends (strings read whole, for their escaped quotes).
  void skip_value() {
    int depth = 0;
    do {
      skip_ws();
      const char c = peek();
      if (c == '"') {
        scratch_.clear();
        string<false>(scratch_);
      } else if (c == '{' || c == '[') {
        ++i_;
        if (++depth > kMaxDepth) refuse("nested too deeply for the compiled builder", i_);
      } else if (c == '}' || c == ']') {
        if (depth == 0) refuse("invalid JSON", i_);
        ++i_;
        --depth;
      } else if (c == ',' || c == ':') {
        if (depth == 0) refuse("invalid JSON", i_);
        ++i_;
      } else {
        // a number or a literal: up to the next delimiter
        ++i_;
        while (i_ < n_) {
          const char d = p_[i_];
          if (d == ',' || d == ':' || d == '}' || d == ']' || d == '"' || d == '{' || d == '[' || d == ' ' ||
              d == '\n' || d == '\r' || d == '\t') {
            break;
          }
          ++i_;
        }
      }
    } while (depth > 0);
  }

  // ------------------------------------------------------------ events

  // Starts an entry of the rest (``extra``): ``{`` or ``,``, then the key (decoded: key_text_).
  void rest_key(KeySet& rest_keys) {
    Buffer& out = extra.data;
    out.push_back(extra.set ? ',' : '{');
    extra.set = true;
    const size_t key_start = out.size();
    out.push_back('"');
    for (size_t k = 0; k < key_size_; ++k) {
      const char ch = key_text_[k];
      const auto u = static_cast<unsigned char>(ch);
      if (u < 0x80) {
        put_escaped_ascii(out, u);
      } else {
        out.push_back(ch);
      }
    }
    out.push_back('"');
    if (!rest_keys.insert(out, key_start, out.size() - key_start)) refuse("a duplicate key in an event", i_);
    out.push_back(':');
  }

  void text_into(TextColumn& column) {
    column.set = true;
    string<false>(column.data);
  }

  void event() {
    skip_ws();
    if (peek() != '{') refuse("an element of traceEvents that is not an object", i_);
    ++i_;
    unsigned seen = 0;
    KeySet& rest_keys = keys_at(1);
    skip_ws();
    if (peek() == '}') {
      ++i_;
    } else {
      for (;;) {
        skip_ws();
        if (peek() != '"') refuse("an object key that is not a string", i_);
        // the key's own bytes when it has no escape and is ASCII (the usual case), else decoded
        size_t close = i_ + 1;
        while (close < n_ && is_plain(p_[close])) ++close;
        if (close < n_ && p_[close] == '"') {
          key_text_ = p_ + i_ + 1;
          key_size_ = close - i_ - 1;
          i_ = close + 1;
        } else {
          scratch_.clear();
          string<false>(scratch_);
          key_text_ = scratch_.data();
          key_size_ = scratch_.size();
        }
        const Key key = key_of(key_text_, key_size_);
        if (key != kOther) {
          if (seen & (1u << key)) refuse("a duplicate key in an event", i_);
          seen |= 1u << key;
        }
        skip_ws();
        expect(':');
        skip_ws();
        const char c = peek();
        bool stored = false;
        switch (key) {
          case kPh:
          case kCat:
          case kName:
            if (c == '"') {
              text_into(key == kPh ? ph : key == kCat ? cat : name);
              stored = true;
            }
            break;
          case kTs:
          case kDur:
            if (c == '-' || (c >= '0' && c <= '9')) {
              const size_t begin = i_;
              const Number num = number();
              if (!num.is_int || (num.integer >= -kExactInDouble && num.integer <= kExactInDouble)) {
                NumberColumn<double>& column = key == kTs ? ts : dur;
                column.set = true;
                column.value = num.is_int ? static_cast<double>(num.integer) : num.real;
                stored = true;
              } else {
                i_ = begin;  // past what a double holds exactly: to extra, as an integer
              }
            }
            break;
          case kPid:
          case kTid:
          case kId: {
            NumberColumn<int64_t>& numbers = key == kPid ? pid : key == kTid ? tid : id;
            TextColumn& labels = key == kPid ? pid_label : key == kTid ? tid_label : id_label;
            if (c == '"') {
              text_into(labels);
              stored = true;
            } else if (c == '-' || (c >= '0' && c <= '9')) {
              const size_t begin = i_;
              const Number num = number();
              if (num.is_int) {
                numbers.set = true;
                numbers.value = num.integer;
                stored = true;
              } else {
                i_ = begin;
              }
            }
            break;
          }
          case kArgs:
            args.set = true;
            value(args.data, 2);
            stored = true;
            break;
          case kOther:
            break;
        }
        if (!stored) {  // key_text_ is still the key: nothing above reads into scratch_
          rest_key(rest_keys);
          value(extra.data, 2);
        }
        skip_ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        break;
      }
    }
    if (extra.set) extra.data.push_back('}');
    for (TextColumn* column : {&ph, &cat, &name, &pid_label, &tid_label, &id_label, &args, &extra}) {
      column->end_row();
    }
    pid.end_row();
    tid.end_row();
    id.end_row();
    ts.end_row();
    dur.end_row();
    ++rows;
  }

  void events() {
    skip_ws();
    if (peek() != '[') refuse("traceEvents is not an array", i_);
    events_begin = i_;
    ++i_;
    skip_ws();
    if (peek() == ']') {
      ++i_;
    } else {
      for (;;) {
        event();
        skip_ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        break;
      }
    }
    events_end = i_;
  }

  void document() {
    reserve();
    skip_ws();
    const char c = peek();
    if (c == '[') {
      events();
      return;
    }
    if (c != '{') refuse("the top level is not an object or an array", i_);
    ++i_;
    bool found = false;
    skip_ws();
    if (peek() == '}') refuse("no traceEvents", i_);
    for (;;) {
      skip_ws();
      if (peek() != '"') refuse("an object key that is not a string", i_);
      scratch_.clear();
      string<false>(scratch_);
      const bool is_events = scratch_.equals("traceEvents");
      skip_ws();
      expect(':');
      if (is_events) {
        if (found) refuse("traceEvents twice", i_);
        found = true;
        events();
      } else {
        skip_value();
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      break;
    }
    if (!found) refuse("no traceEvents", i_);
  }
};

// ------------------------------------------------------------ to Python

PyObject* bytes_of(const void* data, size_t size) {
  return PyBytes_FromStringAndSize(static_cast<const char*>(data), static_cast<Py_ssize_t>(size));
}

// (validity bitmap as bytes, or None when no row is null; null count): Arrow's LSB-first bitmap.
PyObject* validity_of(const std::vector<uint8_t>& valid) {
  size_t nulls = 0;
  for (const uint8_t v : valid) nulls += v ? 0 : 1;
  if (nulls == 0) return Py_BuildValue("(On)", Py_None, Py_ssize_t{0});
  std::vector<uint8_t> bitmap((valid.size() + 7) / 8, 0);
  for (size_t row = 0; row < valid.size(); ++row) {
    if (valid[row]) bitmap[row >> 3] |= static_cast<uint8_t>(1u << (row & 7));
  }
  PyObject* bits = bytes_of(bitmap.data(), bitmap.size());
  if (bits == nullptr) return nullptr;
  return Py_BuildValue("(Nn)", bits, static_cast<Py_ssize_t>(nulls));
}

// (offsets, data, bitmap, null count, offsets are int64): int32 offsets when the text fits them.
PyObject* text_column(const TextColumn& column) {
  PyObject* offsets;
  const bool wide = column.data.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max());
  if (wide) {
    offsets = bytes_of(column.offsets.data(), column.offsets.size() * sizeof(int64_t));
  } else {
    std::vector<int32_t> narrow(column.offsets.begin(), column.offsets.end());
    offsets = bytes_of(narrow.data(), narrow.size() * sizeof(int32_t));
  }
  if (offsets == nullptr) return nullptr;
  PyObject* data = bytes_of(column.data.data(), column.data.size());
  if (data == nullptr) {
    Py_DECREF(offsets);
    return nullptr;
  }
  PyObject* validity = validity_of(column.valid);
  if (validity == nullptr) {
    Py_DECREF(offsets);
    Py_DECREF(data);
    return nullptr;
  }
  PyObject* result = Py_BuildValue("(NNOOO)", offsets, data, PyTuple_GET_ITEM(validity, 0),
                                   PyTuple_GET_ITEM(validity, 1), wide ? Py_True : Py_False);
  Py_DECREF(validity);
  return result;
}

template <typename T>
PyObject* number_column(const NumberColumn<T>& column) {
  PyObject* values = bytes_of(column.values.data(), column.values.size() * sizeof(T));
  if (values == nullptr) return nullptr;
  PyObject* validity = validity_of(column.valid);
  if (validity == nullptr) {
    Py_DECREF(values);
    return nullptr;
  }
  PyObject* result =
      Py_BuildValue("(NOO)", values, PyTuple_GET_ITEM(validity, 0), PyTuple_GET_ITEM(validity, 1));
  Py_DECREF(validity);
  return result;
}

PyObject* columns(PyObject*, PyObject* arg) {
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return nullptr;
  Scanner scanner(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  const char* reason = nullptr;
  size_t at = 0;
  bool failed = false;
  Py_BEGIN_ALLOW_THREADS
  try {
    scanner.document();
  } catch (const Refused& refused) {
    reason = refused.reason;
    at = refused.at;
  } catch (const std::bad_alloc&) {
    failed = true;
  } catch (const std::exception&) {
    reason = "an internal error of the compiled builder";
  }
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&view);
  if (failed) return PyErr_NoMemory();
  if (reason != nullptr) return PyUnicode_FromFormat("%s (byte %zu)", reason, at);
  PyObject* parts[13] = {
      text_column(scanner.ph),        text_column(scanner.cat),       text_column(scanner.name),
      number_column(scanner.pid),     text_column(scanner.pid_label), number_column(scanner.tid),
      text_column(scanner.tid_label), number_column(scanner.ts),      number_column(scanner.dur),
      number_column(scanner.id),      text_column(scanner.id_label),  text_column(scanner.args),
      text_column(scanner.extra),
  };
  bool ok = true;
  for (PyObject* part : parts) ok = ok && part != nullptr;
  PyObject* table = ok ? PyTuple_New(13) : nullptr;
  for (int k = 0; k < 13; ++k) {
    if (table != nullptr) {
      PyTuple_SET_ITEM(table, k, parts[k]);
    } else {
      Py_XDECREF(parts[k]);
    }
  }
  if (table == nullptr) return nullptr;
  return Py_BuildValue("(nnnN)", static_cast<Py_ssize_t>(scanner.rows),
                       static_cast<Py_ssize_t>(scanner.events_begin), static_cast<Py_ssize_t>(scanner.events_end),
                       table);
}

PyMethodDef kMethods[] = {
    {"columns", columns, METH_O,
     "columns(data) -> (rows, events_begin, events_end, columns), or a str saying why the Python "
     "builder must be used instead."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "polyprof_chrome_columns",
    "polyprof's compiled builder of Parquet trace columns from Chrome trace JSON.", -1, kMethods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit_polyprof_chrome_columns(void) {
  return PyModule_Create(&kModule);
}
