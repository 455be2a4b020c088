// Unit tests of the .npy reader/writer (epx/io/npy.hpp).
#include "epx/io/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "epx/error.hpp"

namespace fs = std::filesystem;
using epx::ErrorCode;
using epx::tools::NpyArray;
using epx::tools::read_npy;
using epx::tools::write_npy;

namespace {

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() / ("epx_npy_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path file(const std::string& name) const { return dir_ / name; }

  // Writes raw bytes.
  static void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // A hand-built .npy: magic, version, little-endian length field of the version's width, header, data.
  static std::string npy_bytes(int major, const std::string& header, const std::string& data) {
    std::string s = "\x93NUMPY";
    s += static_cast<char>(major);
    s += '\0';
    const std::size_t n = header.size();
    const int width = major == 1 ? 2 : 4;
    for (int i = 0; i < width; ++i) s += static_cast<char>((n >> (8 * i)) & 0xff);
    return s + header + data;
  }
  static std::string f32_bytes(const std::vector<float>& v) {
    std::string s(v.size() * 4, '\0');
    std::memcpy(s.data(), v.data(), s.size());
    return s;
  }

  // Expects read_npy(p) to throw kIo with a message naming the file and containing `reason`.
  static void expect_read_error(const fs::path& p, const std::string& reason) {
    try {
      (void)read_npy(p);
      ADD_FAILURE() << "read_npy(" << p << ") did not throw; expected: " << reason;
    } catch (const epx::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(reason), std::string::npos) << "expected '" << reason << "' in: " << msg;
    }
  }

  fs::path dir_;
};

std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 37 + 11) & 0xff);
  return v;
}

TEST_F(NpyTest, RoundTripEveryDtypeAndShape) {
  const std::vector<std::string> descrs = {"<u2", "|u1", "<f4", "<f8", "<i8", "<i4", "|b1", "<u8", "<i2", "|i1"};
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {5}, {1}, {0}, {0, 8}, {3, 4}, {2, 3, 4}, {7, 0, 2}};
  for (const auto& descr : descrs) {
    for (const auto& shape : shapes) {
      std::int64_t numel = 1;
      for (auto d : shape) numel *= d;
      const std::size_t itemsize = static_cast<std::size_t>(std::stoi(descr.substr(2)));
      auto data = pattern(static_cast<std::size_t>(numel) * itemsize);
      if (descr == "|b1") {
        for (auto& b : data) b = static_cast<std::byte>(static_cast<int>(b) & 1);
      }
      const fs::path p = file("a.npy");
      write_npy(p, descr, shape, data.data(), data.size());

      // Header layout: version 1.0, total header a multiple of 64 bytes ending in '\n'.
      const auto size = fs::file_size(p);
      ASSERT_GE(size, data.size() + 10);
      const auto header_total = size - data.size();
      EXPECT_EQ(header_total % 64, 0u) << descr;
      std::ifstream f(p, std::ios::binary);
      std::string head(static_cast<std::size_t>(header_total), '\0');
      f.read(head.data(), static_cast<std::streamsize>(head.size()));
      EXPECT_EQ(head.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
      EXPECT_EQ(head.back(), '\n');
      const std::size_t hlen = static_cast<unsigned char>(head[8]) | (static_cast<unsigned char>(head[9]) << 8);
      EXPECT_EQ(hlen + 10, header_total);

      const NpyArray a = read_npy(p);
      EXPECT_EQ(a.descr, descr);
      EXPECT_EQ(a.shape, shape) << descr;
      EXPECT_EQ(a.numel(), numel);
      EXPECT_EQ(a.itemsize(), itemsize);
      EXPECT_EQ(a.data, data) << descr;
    }
  }
}

TEST_F(NpyTest, WriteNormalisesDescrSpelling) {
  const std::vector<float> v = {1.0f, 2.0f};
  write_npy(file("a.npy"), "=f4", {2}, v.data(), 8);
  EXPECT_EQ(read_npy(file("a.npy")).descr, "<f4");
  const std::uint8_t b[3] = {1, 2, 3};
  write_npy(file("b.npy"), "<u1", {3}, b, 3);
  EXPECT_EQ(read_npy(file("b.npy")).descr, "|u1");
}

TEST_F(NpyTest, ShapeReprInHeader) {
  const float x = 1.0f;
  write_npy(file("s.npy"), "<f4", {}, &x, 4);
  write_npy(file("v.npy"), "<f4", {1}, &x, 4);
  auto header_of = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return s.substr(10, s.find('\n') - 10);
  };
  EXPECT_NE(header_of(file("s.npy")).find("'shape': (), }"), std::string::npos) << header_of(file("s.npy"));
  EXPECT_NE(header_of(file("v.npy")).find("'shape': (1,), }"), std::string::npos) << header_of(file("v.npy"));
  EXPECT_EQ(header_of(file("v.npy")).rfind("{'descr': '<f4', 'fortran_order': False, ", 0), 0u);
}

TEST_F(NpyTest, HugeHeaderUsesVersion2) {
  std::vector<std::int64_t> shape(25000, 1);  // "1, " * 25000 > 65535 bytes of header
  const float x = 4.5f;
  write_npy(file("big.npy"), "<f4", shape, &x, 4);
  std::ifstream f(file("big.npy"), std::ios::binary);
  char prefix[12];
  f.read(prefix, 12);
  EXPECT_EQ(prefix[6], 2);
  EXPECT_EQ(prefix[7], 0);
  EXPECT_EQ(fs::file_size(file("big.npy")) % 64, 4u);  // header total multiple of 64, then 4 data bytes
  const NpyArray a = read_npy(file("big.npy"));
  EXPECT_EQ(a.shape, shape);
  float y;
  std::memcpy(&y, a.data.data(), 4);
  EXPECT_EQ(y, 4.5f);
}

TEST_F(NpyTest, HeaderParsingVariants) {
  const std::string data = f32_bytes({1, 2, 3, 4, 5, 6});
  struct Case {
    int major;
    std::string header;
    std::vector<std::int64_t> shape;
  };
  const std::vector<Case> cases = {
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", {2, 3}},
      {1, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}\n", {2, 3}},
      {1, "{'fortran_order':False,'shape':(2,3),'descr':'<f4'}", {2, 3}},
      {1, "  {  \"descr\" : \"<f4\" ,\n 'fortran_order' : False , 'shape' : ( 6 , ) , }      \n", {6}},
      {1, "{'descr': '=f4', 'fortran_order': False, 'shape': (1, 6,), }", {1, 6}},
      {1, "{'descr': '|f4', 'fortran_order': False, 'shape': (3L, 2L), }", {3, 2}},
      {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }" + std::string(50, ' ') + "\n", {6}},
      {3, "{'shape': (2, 1, 3), 'descr': '<f4', 'fortran_order': False}\n", {2, 1, 3}},
  };
  for (const auto& c : cases) {
    write_bytes(file("h.npy"), npy_bytes(c.major, c.header, data));
    const NpyArray a = read_npy(file("h.npy"));
    EXPECT_EQ(a.descr, "<f4") << c.header;
    EXPECT_EQ(a.shape, c.shape) << c.header;
    EXPECT_EQ(a.data.size(), 24u);
    float x[6];
    std::memcpy(x, a.data.data(), 24);
    EXPECT_EQ(x[5], 6.0f);
  }
  // 0-d scalar and 0 rows.
  write_bytes(file("s.npy"),
              npy_bytes(1, "{'descr': '<f8', 'fortran_order': False, 'shape': ()}", std::string(8, '\0')));
  EXPECT_TRUE(read_npy(file("s.npy")).shape.empty());
  write_bytes(file("z.npy"), npy_bytes(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 8)}", ""));
  const NpyArray z = read_npy(file("z.npy"));
  EXPECT_EQ(z.shape, (std::vector<std::int64_t>{0, 8}));
  EXPECT_TRUE(z.data.empty());
  // A '>' mark on a single-byte type (which has no byte order) is accepted.
  write_bytes(file("b.npy"), npy_bytes(1, "{'descr': '>u1', 'fortran_order': False, 'shape': (2,)}", "ab"));
  EXPECT_EQ(read_npy(file("b.npy")).descr, "|u1");
}

TEST_F(NpyTest, RejectsBadMagic) {
  write_bytes(file("m.npy"), "\x93NUMPZ\x01\x00\x10\x00{}");
  expect_read_error(file("m.npy"), "bad magic");
  write_bytes(file("t.npy"), "hello");
  expect_read_error(file("t.npy"), "bad magic");
}

TEST_F(NpyTest, RejectsTruncatedFiles) {
  const std::string full =
      npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", f32_bytes({1, 2, 3, 4, 5, 6}));
  write_bytes(file("e.npy"), "");
  expect_read_error(file("e.npy"), "truncated");
  write_bytes(file("m.npy"), full.substr(0, 4));
  expect_read_error(file("m.npy"), "truncated");
  write_bytes(file("v.npy"), full.substr(0, 7));
  expect_read_error(file("v.npy"), "truncated");
  write_bytes(file("l.npy"), full.substr(0, 9));
  expect_read_error(file("l.npy"), "truncated");
  write_bytes(file("h.npy"), full.substr(0, 30));
  expect_read_error(file("h.npy"), "truncated");
  write_bytes(file("d.npy"), full.substr(0, full.size() - 1));
  expect_read_error(file("d.npy"), "truncated");
}

TEST_F(NpyTest, RejectsMissingFileAndDirectory) {
  expect_read_error(file("nope.npy"), "cannot open");
  expect_read_error(dir_, "directory");
}

TEST_F(NpyTest, RejectsBigEndian) {
  write_bytes(file("be.npy"), npy_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,)}", "abcd"));
  expect_read_error(file("be.npy"), "big-endian");
  write_bytes(file("be8.npy"), npy_bytes(1, "{'descr': '>i8', 'fortran_order': False, 'shape': (0,)}", ""));
  expect_read_error(file("be8.npy"), "big-endian");
}

TEST_F(NpyTest, RejectsFortranOrder) {
  write_bytes(file("f.npy"),
              npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", f32_bytes({1, 2, 3, 4, 5, 6})));
  expect_read_error(file("f.npy"), "fortran_order");
}

TEST_F(NpyTest, RejectsUnsupportedDtypes) {
  for (const std::string d : {"<c8", "|O", "<U5", "|S3", "<f2", "<u4", "<M8[ns]", "|V8", "f4", "<f16"}) {
    write_bytes(file("d.npy"), npy_bytes(1, "{'descr': '" + d + "', 'fortran_order': False, 'shape': (0,)}", ""));
    expect_read_error(file("d.npy"), "unsupported dtype");
  }
  write_bytes(file("s.npy"),
              npy_bytes(1, "{'descr': [('a', '<f4'), ('b', '<i4', (2,))], 'fortran_order': False, 'shape': (0,)}", ""));
  expect_read_error(file("s.npy"), "unsupported dtype");
}

TEST_F(NpyTest, RejectsDataSizeMismatch) {
  write_bytes(file("x.npy"),
              npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", f32_bytes({1, 2, 3})));
  expect_read_error(file("x.npy"), "data size does not match the shape");
}

TEST_F(NpyTest, RejectsMalformedHeaders) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{'descr': '<f4', 'shape': (1,)}", "no 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False}", "no 'shape'"},
      {"{'fortran_order': False, 'shape': (1,)}", "no 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", "malformed header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 'x'}", "unexpected key"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", "duplicate key"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", "invalid shape"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", "malformed header"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", "malformed header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", "not a tuple"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", "malformed header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", "malformed header"},
      {"'descr': '<f4'", "malformed header"},
  };
  for (const auto& [header, reason] : cases) {
    write_bytes(file("h.npy"), npy_bytes(1, header, f32_bytes({1})));
    SCOPED_TRACE(header);
    expect_read_error(file("h.npy"), reason);
  }
  write_bytes(file("v.npy"), npy_bytes(4, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", f32_bytes({1})));
  expect_read_error(file("v.npy"), "unsupported format version");
}

TEST_F(NpyTest, WriteErrors) {
  const float x[2] = {1, 2};
  auto expect_code = [](auto&& fn, ErrorCode code) {
    try {
      fn();
      ADD_FAILURE() << "no exception";
    } catch (const epx::Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  };
  expect_code([&] { write_npy(file("a.npy"), "<c8", {1}, x, 8); }, ErrorCode::kInvalidArgument);
  expect_code([&] { write_npy(file("a.npy"), ">f4", {2}, x, 8); }, ErrorCode::kInvalidArgument);
  expect_code([&] { write_npy(file("a.npy"), "<f4", {3}, x, 8); }, ErrorCode::kInvalidArgument);
  expect_code([&] { write_npy(file("a.npy"), "<f4", {-2}, x, 8); }, ErrorCode::kInvalidArgument);
  expect_code([&] { write_npy(file("no/such/dir/a.npy"), "<f4", {2}, x, 8); }, ErrorCode::kIo);
  expect_code([&] { write_npy(dir_, "<f4", {2}, x, 8); }, ErrorCode::kIo);
  // A failed write that leaves the target as it was (a full device) is in reliability_test.cpp:
  // no test writes to /dev/full or any other system file.
}

// ---- interoperability with numpy itself (skipped without /usr/bin/python3 + numpy) ----

bool have_numpy() {
  return fs::exists("/usr/bin/python3") && std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

int run_python(const fs::path& script, const fs::path& dir) {
  const std::string cmd = "/usr/bin/python3 '" + script.string() + "' '" + dir.string() + "'";
  return std::system(cmd.c_str());
}

template <typename T>
std::vector<T> values_of(const NpyArray& a) {
  EXPECT_EQ(a.data.size(), static_cast<std::size_t>(a.numel()) * sizeof(T));
  std::vector<T> v(a.data.size() / sizeof(T));
  std::memcpy(v.data(), a.data.data(), v.size() * sizeof(T));
  return v;
}

TEST_F(NpyTest, NumpyWritesWeRead) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  const fs::path script = file("save.py");
  {
    std::ofstream f(script);
    f << R"PY(import sys, numpy as np
d = sys.argv[1]
np.save(d + "/u2.npy", np.arange(12, dtype="<u2").reshape(3, 4) * 1000)
np.save(d + "/i8.npy", np.array([-1, 2**40, 3], dtype="<i8"))
np.save(d + "/f4.npy", np.array([[1.5, -2.25], [3e-3, 1e30]], dtype="<f4"))
np.save(d + "/b.npy", np.array([True, False, True]))
np.save(d + "/scalar.npy", np.array(3.5))
np.save(d + "/empty.npy", np.zeros((0, 8), dtype="<f4"))
np.save(d + "/fortran.npy", np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
np.save(d + "/be.npy", np.arange(4, dtype=">f4"))
np.save(d + "/c8.npy", np.zeros(2, dtype="<c8"))
np.save(d + "/obj.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
np.save(d + "/struct.npy", np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")]))
for v in [(2, 0), (3, 0)]:
    with open(d + "/v%d.npy" % v[0], "wb") as f:
        np.lib.format.write_array(f, np.arange(5, dtype="<i2") - 2, version=v)
)PY";
  }
  ASSERT_EQ(run_python(script, dir_), 0);

  NpyArray a = read_npy(file("u2.npy"));
  EXPECT_EQ(a.descr, "<u2");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3, 4}));
  auto u2 = values_of<std::uint16_t>(a);
  for (std::size_t i = 0; i < u2.size(); ++i) EXPECT_EQ(u2[i], i * 1000);

  a = read_npy(file("i8.npy"));
  EXPECT_EQ(a.descr, "<i8");
  EXPECT_EQ(values_of<std::int64_t>(a), (std::vector<std::int64_t>{-1, std::int64_t{1} << 40, 3}));

  a = read_npy(file("f4.npy"));
  EXPECT_EQ(a.descr, "<f4");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{1.5f, -2.25f, 3e-3f, 1e30f}));

  a = read_npy(file("b.npy"));
  EXPECT_EQ(a.descr, "|b1");
  EXPECT_EQ(values_of<std::uint8_t>(a), (std::vector<std::uint8_t>{1, 0, 1}));

  a = read_npy(file("scalar.npy"));
  EXPECT_EQ(a.descr, "<f8");
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(values_of<double>(a), (std::vector<double>{3.5}));

  a = read_npy(file("empty.npy"));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{0, 8}));
  EXPECT_TRUE(a.data.empty());

  for (const char* v : {"v2.npy", "v3.npy"}) {
    a = read_npy(file(v));
    EXPECT_EQ(a.descr, "<i2") << v;
    EXPECT_EQ(values_of<std::int16_t>(a), (std::vector<std::int16_t>{-2, -1, 0, 1, 2})) << v;
  }

  expect_read_error(file("fortran.npy"), "fortran_order");
  expect_read_error(file("be.npy"), "big-endian");
  expect_read_error(file("c8.npy"), "unsupported dtype");
  expect_read_error(file("obj.npy"), "unsupported dtype");
  expect_read_error(file("struct.npy"), "unsupported dtype");
}

TEST_F(NpyTest, NumpyReadsWhatWeWrite) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  // Value i of each array: floats i*0.5-3, bools i%3==0, unsigned i*7, signed i*7-5.
  const std::vector<std::string> descrs = {"<u2", "|u1", "<f4", "<f8", "<i8", "<i4", "|b1", "<u8", "<i2", "|i1"};
  const std::vector<std::vector<std::int64_t>> shapes = {{3, 4}, {0, 8}, {5}, {}};
  std::string checks;
  int n_file = 0;
  for (const auto& descr : descrs) {
    for (const auto& shape : shapes) {
      std::int64_t numel = 1;
      for (auto d : shape) numel *= d;
      const std::size_t itemsize = static_cast<std::size_t>(std::stoi(descr.substr(2)));
      std::vector<std::byte> bytes(static_cast<std::size_t>(numel) * itemsize);
      for (std::int64_t i = 0; i < numel; ++i) {
        std::byte* dst = bytes.data() + static_cast<std::size_t>(i) * itemsize;
        const char kind = descr[1];
        if (kind == 'f' && itemsize == 4) {
          const float v = static_cast<float>(i) * 0.5f - 3.0f;
          std::memcpy(dst, &v, 4);
        } else if (kind == 'f') {
          const double v = static_cast<double>(i) * 0.5 - 3.0;
          std::memcpy(dst, &v, 8);
        } else if (kind == 'b') {
          *dst = static_cast<std::byte>(i % 3 == 0);
        } else {
          const std::int64_t v = kind == 'u' ? i * 7 : i * 7 - 5;
          std::memcpy(dst, &v, itemsize);  // little-endian truncation
        }
      }
      const std::string name = "w" + std::to_string(n_file++) + ".npy";
      write_npy(file(name), descr, shape, bytes.data(), bytes.size());
      std::string shape_py = "(";
      for (auto d : shape) shape_py += std::to_string(d) + ",";
      shape_py += ")";
      checks += "expect('" + name + "', '" + descr + "', " + shape_py + ")\n";
    }
  }
  const fs::path script = file("load.py");
  {
    std::ofstream f(script);
    f << R"PY(import sys, numpy as np
d = sys.argv[1]
def expect(name, dtype, shape):
    a = np.load(d + "/" + name)
    assert a.dtype == np.dtype(dtype), (name, a.dtype, dtype)
    assert a.shape == shape, (name, a.shape, shape)
    i = np.arange(int(np.prod(shape)))
    kind = np.dtype(dtype).kind
    if kind == "f": e = i * 0.5 - 3
    elif kind == "b": e = i % 3 == 0
    elif kind == "u": e = i * 7
    else: e = i * 7 - 5
    e = e.astype(dtype).reshape(shape)
    assert np.array_equal(a, e), (name, a, e)
)PY" << checks
      << "print('numpy read', " << n_file << ", 'files')\n";
  }
  EXPECT_EQ(run_python(script, dir_), 0);
}

}  // namespace
