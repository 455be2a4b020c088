// npy.cpp — .npy reader and writer, see npy.hpp.
#include "epx/io/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include "epx/error.hpp"
#include "epx/io/file_io.hpp"

static_assert(std::endian::native == std::endian::little, "the .npy code assumes a little-endian host");

namespace epx::tools {

namespace {

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes + NUL
constexpr std::size_t kMagicLen = 6;

std::string quoted(const std::filesystem::path& path) {
  return "'" + path.string() + "'";
}

[[noreturn]] void fail_io(const std::filesystem::path& path, const std::string& reason) {
  throw Error(ErrorCode::kIo, "npy file " + quoted(path) + ": " + reason);
}

std::string shape_repr(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  s += ")";
  return s;
}

std::size_t descr_itemsize(const std::string& descr) {
  if (descr.size() < 3) return 0;
  return static_cast<std::size_t>(std::stoul(descr.substr(2)));
}

/// numel of `shape`, or nullopt on a negative dimension or if numel * itemsize overflows int64.
std::optional<std::int64_t> checked_numel(const std::vector<std::int64_t>& shape, std::size_t itemsize) {
  const std::int64_t limit =
      std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(itemsize ? itemsize : 1);
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > limit / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// ---- header dict parser: a tiny subset of Python literal syntax ----

struct Value {
  enum class Kind { kString, kBool, kTuple, kList };
  Kind kind = Kind::kString;
  std::string str;
  bool boolean = false;
  std::vector<std::int64_t> ints;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::filesystem::path& path) : s_(text), path_(path) {}

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  void expect(char c) {
    skip_ws();
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++pos_;
  }

  [[noreturn]] void bad(const std::string& what) const {
    fail_io(path_, "malformed header (" + what + " at offset " + std::to_string(pos_) + "): " + std::string(s_));
  }

  std::string parse_string() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a string");
    ++pos_;
    std::string out;
    while (true) {
      if (at_end()) bad("unterminated string");
      char c = s_[pos_++];
      if (c == q) break;
      if (c == '\\') {
        if (at_end()) bad("unterminated string");
        c = s_[pos_++];
      }
      out += c;
    }
    return out;
  }

  std::int64_t parse_int() {
    skip_ws();
    bool neg = false;
    if (peek() == '-' || peek() == '+') {
      neg = peek() == '-';
      ++pos_;
    }
    if (!(peek() >= '0' && peek() <= '9')) bad("expected an integer");
    std::int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10) bad("integer too large");
      v = v * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L' || peek() == 'l') ++pos_;  // Python 2 long suffix, written by old numpy
    return neg ? -v : v;
  }

  // Skips a (possibly nested) list/tuple literal, used only to recognise structured dtypes.
  void skip_bracketed() {
    int depth = 0;
    do {
      if (at_end()) bad("unterminated list");
      const char c = peek();
      if (c == '\'' || c == '"') {
        parse_string();
        continue;
      }
      if (c == '[' || c == '(') ++depth;
      if (c == ']' || c == ')') --depth;
      ++pos_;
    } while (depth > 0);
  }

  Value parse_value() {
    skip_ws();
    Value v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = Value::Kind::kString;
      v.str = parse_string();
    } else if (s_.substr(pos_, 4) == "True") {
      v.kind = Value::Kind::kBool;
      v.boolean = true;
      pos_ += 4;
    } else if (s_.substr(pos_, 5) == "False") {
      v.kind = Value::Kind::kBool;
      v.boolean = false;
      pos_ += 5;
    } else if (c == '(') {
      v.kind = Value::Kind::kTuple;
      ++pos_;
      skip_ws();
      if (peek() == ')') {
        ++pos_;
        return v;
      }
      while (true) {
        v.ints.push_back(parse_int());
        skip_ws();
        if (peek() == ')') {
          ++pos_;
          if (v.ints.size() == 1) bad("a one-element tuple needs a trailing comma");
          break;
        }
        if (peek() != ',') bad("expected ',' or ')' in tuple");
        ++pos_;
        skip_ws();
        if (peek() == ')') {
          ++pos_;
          break;
        }
      }
    } else if (c == '[') {
      v.kind = Value::Kind::kList;
      skip_bracketed();
    } else {
      bad("unexpected value");
    }
    return v;
  }

 private:
  std::string_view s_;
  const std::filesystem::path& path_;
  std::size_t pos_ = 0;
};

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

Header parse_header(std::string_view text, const std::filesystem::path& path) {
  HeaderParser p(text, path);
  std::optional<Value> descr, fortran, shape;
  p.expect('{');
  while (true) {
    p.skip_ws();
    if (p.peek() == '}') break;
    const std::string key = p.parse_string();
    p.expect(':');
    Value v = p.parse_value();
    std::optional<Value>* slot = nullptr;
    if (key == "descr")
      slot = &descr;
    else if (key == "fortran_order")
      slot = &fortran;
    else if (key == "shape")
      slot = &shape;
    else
      fail_io(path, "unexpected key '" + key + "' in header");
    if (slot->has_value()) fail_io(path, "duplicate key '" + key + "' in header");
    *slot = std::move(v);
    p.skip_ws();
    if (p.peek() == ',') {
      p.expect(',');
      continue;
    }
    if (p.peek() != '}') p.bad("expected ',' or '}'");
  }
  p.expect('}');
  p.skip_ws();
  if (!p.at_end()) p.bad("trailing characters after the dict");
  if (!descr) fail_io(path, "header has no 'descr'");
  if (!fortran) fail_io(path, "header has no 'fortran_order'");
  if (!shape) fail_io(path, "header has no 'shape'");

  Header h;
  if (descr->kind == Value::Kind::kList) fail_io(path, "unsupported dtype: structured arrays are not supported");
  if (descr->kind != Value::Kind::kString) fail_io(path, "'descr' is not a string");
  h.descr = descr->str;
  if (fortran->kind != Value::Kind::kBool) fail_io(path, "'fortran_order' is not True or False");
  h.fortran_order = fortran->boolean;
  if (shape->kind != Value::Kind::kTuple) fail_io(path, "'shape' is not a tuple");
  h.shape = shape->ints;
  return h;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

std::string normalize_npy_descr(const std::string& descr) {
  if (descr.size() != 3) return "";
  const char order = descr[0];
  const std::string type = descr.substr(1);
  if (order != '<' && order != '=' && order != '|' && order != '>') return "";
  if (type == "u1" || type == "b1" || type == "i1") return "|" + type;  // no byte order for single bytes
  if (type == "u2" || type == "f4" || type == "f8" || type == "i8" || type == "i4" || type == "u8" || type == "i2") {
    if (order == '>') return "";
    return "<" + type;
  }
  return "";
}

std::int64_t NpyArray::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::size_t NpyArray::itemsize() const {
  return descr_itemsize(descr);
}

namespace {

using File = std::unique_ptr<std::FILE, FileCloser>;

// `path` opened for reading if it is a regular file; its size in *size.
File open_regular(const std::filesystem::path& path, std::uintmax_t* size) {
  // O_NONBLOCK: a FIFO given as an input must not block the open; only regular files are read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail_io(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    fail_io(path, dir ? "is a directory" : "is not a regular file (a device, FIFO or socket)");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  File file(::fdopen(fd, "rb"));
  if (!file) {
    ::close(fd);
    fail_io(path, std::string("cannot open: ") + std::strerror(errno));
  }
  *size = static_cast<std::uintmax_t>(st.st_size);
  return file;
}

// Exactly n bytes of f into dst, or an error naming `what` (a read error, or how short it was).
void read_exact(std::FILE* f, const std::filesystem::path& path, void* dst, std::size_t n, const char* what) {
  const std::size_t got = std::fread(dst, 1, n, f);
  if (got != n) {
    if (std::ferror(f)) fail_io(path, std::string("read error in ") + what + ": " + std::strerror(errno));
    fail_io(path, std::string("truncated file: ") + what + " needs " + std::to_string(n) + " bytes, only " +
                      std::to_string(got) + " present");
  }
}

// The magic, the version and the header length; returns the header's length, and in
// *prefix_len the bytes before it (10 for version 1.0, else 12).
std::size_t read_prefix(std::FILE* f, const std::filesystem::path& path, std::size_t* prefix_len) {
  unsigned char prefix[8];
  const std::size_t got = std::fread(prefix, 1, sizeof prefix, f);
  if (got >= kMagicLen && std::memcmp(prefix, kMagic, kMagicLen) != 0) fail_io(path, "bad magic: not a .npy file");
  if (got < kMagicLen) {
    if (std::memcmp(prefix, kMagic, got) != 0) fail_io(path, "bad magic: not a .npy file");
    fail_io(path, "truncated file: " + std::to_string(got) + " bytes, shorter than the .npy magic");
  }
  if (got < sizeof prefix) fail_io(path, "truncated file: no format version");
  const int major = prefix[6];
  const int minor = prefix[7];
  if (!((major == 1 || major == 2 || major == 3) && minor == 0)) {
    fail_io(path, "unsupported format version " + std::to_string(major) + "." + std::to_string(minor) +
                      " (1.0, 2.0 and 3.0 are supported)");
  }
  unsigned char b[4] = {0, 0, 0, 0};
  read_exact(f, path, b, major == 1 ? 2 : 4, "the header length");
  *prefix_len = major == 1 ? 10 : 12;
  return static_cast<std::size_t>(b[0]) | (static_cast<std::size_t>(b[1]) << 8) |
         (static_cast<std::size_t>(b[2]) << 16) | (static_cast<std::size_t>(b[3]) << 24);
}

// The header's dtype in epx's normal form, or an error naming what is not supported.
std::string supported_descr(const Header& h, const std::filesystem::path& path) {
  const std::string descr = normalize_npy_descr(h.descr);
  if (descr.empty()) {
    if (h.descr.size() == 3 && h.descr[0] == '>' && !normalize_npy_descr("<" + h.descr.substr(1)).empty()) {
      fail_io(path, "big-endian data ('" + h.descr + "') is not supported");
    }
    fail_io(path,
            "unsupported dtype '" + h.descr + "' (supported: <u2 |u1 <f4 <f8 <i8 <i4 |b1 <u8 <i2 |i1, little-endian)");
  }
  if (h.fortran_order) fail_io(path, "fortran_order True (column-major) arrays are not supported");
  return descr;
}

NpyArray read_npy_impl(const std::filesystem::path& path, bool with_data) {
  std::uintmax_t file_size = 0;
  const File file = open_regular(path, &file_size);
  std::FILE* f = file.get();
  std::size_t prefix_len = 0;
  const std::size_t header_len = read_prefix(f, path, &prefix_len);
  // Guard against a bogus length before allocating.
  if (header_len > file_size - std::min<std::uintmax_t>(file_size, prefix_len)) {
    fail_io(path, "truncated file: header length " + std::to_string(header_len) + " exceeds the file size " +
                      std::to_string(file_size));
  }
  std::string header(header_len, '\0');
  read_exact(f, path, header.data(), header_len, "the header");
  const Header h = parse_header(header, path);

  NpyArray out;
  out.descr = supported_descr(h, path);
  out.shape = h.shape;
  const auto numel = checked_numel(out.shape, out.itemsize());
  if (!numel) fail_io(path, "invalid shape " + shape_repr(out.shape));
  const auto nbytes = static_cast<std::uint64_t>(*numel) * out.itemsize();
  const std::uint64_t data_offset = prefix_len + header_len;
  if (file_size != data_offset + nbytes) {
    const std::uint64_t present = file_size - data_offset;
    fail_io(path, std::string(present < nbytes ? "truncated file" : "data size does not match the shape") + ": shape " +
                      shape_repr(out.shape) + " of " + out.descr + " needs " + std::to_string(nbytes) +
                      " data bytes, the file has " + std::to_string(present));
  }
  if (!with_data) return out;
  out.data.resize(static_cast<std::size_t>(nbytes));
  read_exact(f, path, out.data.data(), out.data.size(), "the data");
  if (std::fgetc(f) != EOF) {
    fail_io(path, "data size does not match the shape: more than " + std::to_string(nbytes) + " data bytes for shape " +
                      shape_repr(out.shape) + " of " + out.descr);
  }
  return out;
}

}  // namespace

NpyArray read_npy(const std::filesystem::path& path) { return read_npy_impl(path, true); }

NpyArray read_npy_header(const std::filesystem::path& path) { return read_npy_impl(path, false); }

void write_npy(const std::filesystem::path& path, const std::string& descr, const std::vector<std::int64_t>& shape,
               const void* data, std::size_t nbytes) {
  const std::string norm = normalize_npy_descr(descr);
  if (norm.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "write_npy " + quoted(path) + ": unsupported dtype '" + descr + "'");
  }
  const std::size_t itemsize = descr_itemsize(norm);
  const auto numel = checked_numel(shape, itemsize);
  if (!numel) {
    throw Error(ErrorCode::kInvalidArgument, "write_npy " + quoted(path) + ": invalid shape " + shape_repr(shape));
  }
  if (static_cast<std::uint64_t>(*numel) * itemsize != nbytes) {
    throw Error(ErrorCode::kInvalidArgument, "write_npy " + quoted(path) + ": " + std::to_string(nbytes) +
                                                 " bytes given for shape " + shape_repr(shape) + " of " + norm +
                                                 " (needs " +
                                                 std::to_string(*numel * static_cast<std::int64_t>(itemsize)) + ")");
  }
  if (nbytes > 0 && data == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "write_npy " + quoted(path) + ": null data pointer");
  }

  std::string dict = "{'descr': '" + norm + "', 'fortran_order': False, 'shape': " + shape_repr(shape) + ", }";
  std::size_t prefix_len = 10;
  auto padded = [&](std::size_t pre) {  // header length (dict + spaces + '\n') so pre + it is a multiple of 64
    const std::size_t raw = pre + dict.size() + 1;
    return (raw + 63) / 64 * 64 - pre;
  };
  std::size_t header_len = padded(prefix_len);
  int major = 1;
  if (header_len > 65535) {
    major = 2;
    prefix_len = 12;
    header_len = padded(prefix_len);
  }
  std::string head(kMagic, kMagicLen);
  head += static_cast<char>(major);
  head += '\0';
  if (major == 1) {
    head += static_cast<char>(header_len & 0xff);
    head += static_cast<char>((header_len >> 8) & 0xff);
  } else {
    for (int i = 0; i < 4; ++i) head += static_cast<char>((header_len >> (8 * i)) & 0xff);
  }
  head += dict;
  head.append(header_len - dict.size() - 1, ' ');
  head += '\n';

  // Written beside the target and renamed over it on success: a failed write never removes
  // or truncates what was at `path` (file_io.hpp).
  write_file_safely(path, "npy file", [&](std::FILE* f) {
    std::fwrite(head.data(), 1, head.size(), f);
    if (nbytes > 0) std::fwrite(data, 1, nbytes, f);
  });
}

}  // namespace epx::tools
