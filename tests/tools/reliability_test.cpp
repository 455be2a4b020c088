// Reliability (docs/reliability.md): bad inputs, full devices and hostile sizes get a clean epx::Error, fast, and
// nothing epx did not create is ever removed. Every test works in its own temp directory;
// none touches a system file. Children (fork) are used where a test sets a resource limit
// or where the old behaviour would block forever (bounded by alarm()).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "epx/bench/options.hpp"
#include "bench/output.hpp"
#include "epx/bench/report.hpp"
#include "epx/bench/run.hpp"
#include "epx/bench/runner.hpp"
#include "commands.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/topology.hpp"
#include "epx/io/file_io.hpp"
#include "epx/io/npy.hpp"
#include "epx/io/replay.hpp"

namespace fs = std::filesystem;
using epx::Error;
using epx::ErrorCode;

namespace {

class ReliabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = fs::temp_directory_path() / ("epx_reliability_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  // Runs `fn` in a child (with `seconds` of alarm) and returns its exit status: 0 if `fn`
  // returned true, 1 if false, 2 if it threw, or the signal that ended it.
  static int in_child(const std::function<bool()>& fn, unsigned seconds = 10) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(seconds);
      int code = 2;
      try {
        code = fn() ? 0 : 1;
      } catch (...) {
      }
      std::fflush(nullptr);
      _exit(code);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // A docs/spec.md §7 input set: P ranks, E experts, H hidden, K top-k, S tokens per rank.
  void make_inputs(const fs::path& in, int P, int E, int H, int K, int S, const std::string& meta_suffix = "",
                   int meta_hidden = -1) {
    fs::create_directories(in);
    std::ofstream(in / "meta.json") << "{\"num_ranks\": " << P << ", \"num_experts\": " << E
                                    << ", \"hidden\": " << (meta_hidden > 0 ? meta_hidden : H) << ", \"num_topk\": " << K
                                    << "}" << meta_suffix;
    for (int r = 0; r < P; ++r) {
      const fs::path rd = in / ("rank" + std::to_string(r));
      fs::create_directories(rd);
      std::vector<std::int64_t> idx;
      std::vector<float> w;
      for (int t = 0; t < S; ++t)
        for (int k = 0; k < K; ++k) idx.push_back((t + k + r) % E), w.push_back(0.5f);
      std::vector<std::uint16_t> x(static_cast<std::size_t>(S) * H, 0x3f80);  // bf16 1.0
      epx::tools::write_npy(rd / "topk_idx.npy", "<i8", {S, K}, idx.data(), idx.size() * 8);
      epx::tools::write_npy(rd / "topk_weights.npy", "<f4", {S, K}, w.data(), w.size() * 4);
      epx::tools::write_npy(rd / "x.npy", "<u2", {S, H}, x.data(), x.size() * 2);
    }
  }

  // `epx replay ARGS` through the real command line; rethrows what the command throws.
  static void replay(const std::vector<std::string>& args) {
    CLI::App app;
    epx::tools::add_replay_command(app);
    std::vector<std::string> argv = {"replay"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> rev(argv.rbegin(), argv.rend());
    app.parse(rev);
  }

  static ErrorCode code_of(const std::function<void()>& fn, std::string* what = nullptr) {
    try {
      fn();
    } catch (const Error& e) {
      if (what) *what = e.what();
      return e.code();
    }
    ADD_FAILURE() << "no epx::Error";
    return ErrorCode::kInternal;
  }

  fs::path dir_;
};

// ---- class 3: never remove what epx did not create ----

// A write that fails part-way (a full device; here the file-size limit, EFBIG) leaves the
// target exactly as it was. Before: write_npy removed the target path (as root, /dev/full).
TEST_F(ReliabilityTest, FailedNpyWriteKeepsTheTarget) {
  const fs::path target = dir_ / "precious.npy";
  std::ofstream(target) << "precious bytes";
  const int status = in_child([&] {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl {4096, 4096};
    setrlimit(RLIMIT_FSIZE, &rl);
    std::vector<float> big(100000, 1.0f);
    try {
      epx::tools::write_npy(target, "<f4", {100000}, big.data(), big.size() * 4);
    } catch (const Error& e) {
      return e.code() == ErrorCode::kIo && std::strstr(e.what(), "precious.npy") != nullptr;
    }
    return false;
  });
  EXPECT_EQ(status, 0) << "write_npy did not fail with kIo naming the file";
  ASSERT_TRUE(fs::exists(target)) << "a failed write removed the target";
  EXPECT_EQ(slurp(target), "precious bytes");
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename(), "precious.npy") << "left behind: " << e.path();
}

TEST_F(ReliabilityTest, NpyWriteOverADirectoryLeavesIt) {
  fs::create_directories(dir_ / "d");
  std::ofstream(dir_ / "d" / "keep") << "k";
  const float x[2] = {1, 2};
  EXPECT_EQ(code_of([&] { epx::tools::write_npy(dir_ / "d", "<f4", {2}, x, 8); }), ErrorCode::kIo);
  EXPECT_TRUE(fs::exists(dir_ / "d" / "keep"));
}

// A successful write replaces the old file whole (and a reader never sees half a file).
TEST_F(ReliabilityTest, NpyWriteReplacesOnSuccess) {
  const fs::path target = dir_ / "a.npy";
  std::ofstream(target) << "old";
  const float x[2] = {1, 2};
  epx::tools::write_npy(target, "<f4", {2}, x, 8);
  const epx::tools::NpyArray a = epx::tools::read_npy(target);
  ASSERT_EQ(a.shape, std::vector<std::int64_t>{2});
  EXPECT_EQ(std::memcmp(a.data.data(), x, 8), 0);
}

// --json / --trace on a device that fills up: an error, not exit 0.
TEST_F(ReliabilityTest, BenchJsonAndTraceWritesAreChecked) {
  for (const char* which : {"json", "trace"}) {
    const fs::path target = dir_ / (std::string(which) + ".out");
    const int status = in_child([&] {
      signal(SIGXFSZ, SIG_IGN);
      struct rlimit rl {16, 16};
      setrlimit(RLIMIT_FSIZE, &rl);
      try {
        if (std::string(which) == "json") {
          epx::tools::BenchReport rep;
          epx::tools::write_bench_json(target, rep);
        } else {
          epx::tools::BenchRankRecord rec;
          epx::tools::write_bench_trace(target, std::vector<epx::tools::BenchRankRecord>(4, rec));
        }
      } catch (const Error& e) {
        return e.code() == ErrorCode::kIo;
      }
      return false;
    });
    EXPECT_EQ(status, 0) << which << ": a write beyond the device's space did not fail";
    EXPECT_FALSE(fs::exists(target)) << which << ": a partial file was left";
  }
}

TEST_F(ReliabilityTest, ReplayRefusesOverlappingInAndOut) {
  const fs::path in = dir_ / "in";
  make_inputs(in, 2, 4, 128, 2, 3);
  for (const fs::path& out : {in, in / "out", dir_}) {
    std::string what;
    EXPECT_EQ(code_of([&] { replay({"--in", in.string(), "--out", out.string(), "--transport", "threads"}); }, &what),
              ErrorCode::kInvalidArgument)
        << out;
    EXPECT_NE(what.find("overlap"), std::string::npos) << what;
    for (int r = 0; r < 2; ++r)
      ASSERT_TRUE(fs::exists(in / ("rank" + std::to_string(r)) / "topk_idx.npy")) << "the inputs were removed (" << out << ")";
  }
}

// An OUT/rank<r> epx did not write is never replaced nor removed, and a failed run removes
// only what epx made. A replay that works still replaces its own earlier results.
TEST_F(ReliabilityTest, ReplayNeverRemovesWhatItDidNotCreate) {
  const fs::path in = dir_ / "in", out = dir_ / "out";
  make_inputs(in, 2, 4, 128, 2, 3);
  fs::create_directories(out / "rank1");
  std::ofstream(out / "rank1" / "notes.txt") << "mine";
  EXPECT_EQ(code_of([&] { replay({"--in", in.string(), "--out", out.string(), "--transport", "threads"}); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(slurp(out / "rank1" / "notes.txt"), "mine");
  fs::remove_all(out / "rank1");
  replay({"--in", in.string(), "--out", out.string(), "--transport", "threads"});
  EXPECT_TRUE(fs::exists(out / "rank1" / "combined_x.npy"));
  replay({"--in", in.string(), "--out", out.string(), "--transport", "threads"});  // its own results: replaced
  EXPECT_TRUE(fs::exists(out / "rank1" / "combined_x.npy"));
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_TRUE(e.path().filename() == "rank0" || e.path().filename() == "rank1") << "left behind: " << e.path();
}

TEST_F(ReliabilityTest, MetaJsonRejectsTrailingGarbage) {
  const fs::path in = dir_ / "in";
  make_inputs(in, 2, 4, 128, 2, 3, " {\"hidden\": 1}");
  std::string what;
  EXPECT_EQ(code_of([&] { epx::tools::read_replay_meta(in); }, &what), ErrorCode::kIo);
  EXPECT_NE(what.find("meta.json"), std::string::npos) << what;
}

TEST_F(ReliabilityTest, TimeoutRuleIsTheSameForReplayAndBench) {
  const fs::path in = dir_ / "in";
  make_inputs(in, 2, 4, 128, 2, 3);
  for (const char* bad : {"0", "-1", "86400001"}) {
    std::string r, b;
    EXPECT_EQ(code_of([&] { replay({"--in", in.string(), "--out", (dir_ / "o").string(), "--timeout-ms", bad}); }, &r),
              ErrorCode::kInvalidArgument)
        << bad;
    epx::tools::BenchOptions o;
    o.timeout_ms = std::stoll(bad);
    o.transport = "threads";
    EXPECT_EQ(code_of([&] { epx::tools::validate_options(o); }, &b), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.find("--timeout-ms must be in [1, 86400000]"), std::string::npos) << r;
    EXPECT_NE(b.find("--timeout-ms must be in [1, 86400000]"), std::string::npos) << b;
  }
  EXPECT_FALSE(fs::exists(dir_ / "o" / "rank0"));
}

TEST_F(ReliabilityTest, RanksAndWorkersAreBounded) {
  epx::tools::BenchOptions o;
  o.transport = "shm";
  o.ranks = 1000, o.experts = 1000, o.tokens = 1, o.hidden = 128;
  std::string what;
  EXPECT_EQ(code_of([&] { epx::tools::validate_options(o); }, &what), ErrorCode::kInvalidArgument);
  EXPECT_NE(what.find("ranks"), std::string::npos) << what;
  EXPECT_EQ(code_of([&] { epx::launch({.num_ranks = 5000, .transport = epx::TransportKind::kThreads}, [](epx::Transport&) {}); }),
            ErrorCode::kInvalidArgument);
  epx::tools::BenchOptions w;
  w.transport = "threads";
  w.ranks = 2, w.experts = 4, w.tokens = 4, w.hidden = 128, w.topk = 2;
  for (int workers : {100000, 257}) {
    w.workers = workers;
    EXPECT_EQ(code_of([&] { epx::tools::validate_options(w); }, &what), ErrorCode::kInvalidArgument) << workers;
    EXPECT_NE(what.find("--workers"), std::string::npos) << what;
  }
  const fs::path in = dir_ / "in";
  make_inputs(in, 2, 4, 128, 2, 3);
  EXPECT_EQ(code_of([&] { replay({"--in", in.string(), "--out", (dir_ / "o").string(), "--workers", "100000"}); }),
            ErrorCode::kInvalidArgument);
}

// `epx bench` SIGKILLed or SIGTERMed mid-run (from outside: no test hook): its epx-bench-*
// temp directory is gone shortly after (the janitor), and so are its ranks.
TEST_F(ReliabilityTest, BenchTempDirIsRemovedWhenTheLauncherIsKilled) {
  for (int sig : {SIGKILL, SIGTERM}) {
    const fs::path tmp = dir_ / ("tmp" + std::to_string(sig));
    fs::create_directories(tmp);
    std::fflush(nullptr);
    const pid_t child = fork();
    if (child == 0) {
      alarm(60);
      signal(SIGTERM, SIG_DFL);
      setenv("TMPDIR", tmp.c_str(), 1);
      epx::tools::BenchOptions o;
      o.ranks = 2, o.hidden = 256, o.topk = 2, o.experts = 4, o.tokens = 16, o.iters = 1000000, o.warmup = 0;
      o.overhead_iters = 0, o.progress = false, o.transport = "shm";
      try {
        epx::tools::measure_bench(o);
      } catch (...) {
      }
      _exit(0);
    }
    auto has_entries = [&] { return fs::directory_iterator(tmp) != fs::directory_iterator(); };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!has_entries() && std::chrono::steady_clock::now() < deadline) usleep(10000);
    ASSERT_TRUE(has_entries()) << "the bench made no temp dir";
    usleep(300000);  // the ranks are running now
    kill(child, sig);
    int status = 0;
    waitpid(child, &status, 0);
    const auto gone = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (has_entries() && std::chrono::steady_clock::now() < gone) usleep(10000);
    EXPECT_FALSE(has_entries()) << "signal " << sig << ": " << fs::directory_iterator(tmp)->path() << " was left";
  }
}

// ---- class 1: sizes against the inputs, then memory, before anything big is allocated ----

TEST_F(ReliabilityTest, AbsurdBenchSizesFailFastAndClean) {
  struct Case {
    const char* name;
    std::int64_t tokens;
    int hidden;
  };
  for (const Case c : {Case{"--tokens 1000000", 1000000, 7168}, Case{"--hidden 2147483647", 512, 2147483647}}) {
    epx::tools::BenchOptions o;  // defaults: 8 shm ranks, K = 8, E = 256
    o.tokens = c.tokens, o.hidden = c.hidden;
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    EXPECT_EQ(code_of([&] { epx::tools::validate_options(o); }, &what), ErrorCode::kCapacityExceeded) << c.name;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << c.name;
    EXPECT_NE(what.find("per rank x 8 ranks"), std::string::npos) << what;
  }
}

TEST_F(ReliabilityTest, MetaSizesAreCheckedAgainstTheFiles) {
  const fs::path in = dir_ / "in";
  make_inputs(in, 2, 4, 128, 2, 3, "", 1 << 30);  // meta.json says H = 2^30, the files are 128 wide
  std::string what;
  EXPECT_EQ(code_of([&] { replay({"--in", in.string(), "--out", (dir_ / "o").string()}); }, &what), ErrorCode::kShapeMismatch);
  EXPECT_NE(what.find("x.npy"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
  // A huge num_max_tokens_per_rank or --worst: the memory check refuses, before any rank starts.
  fs::remove_all(in);
  make_inputs(in, 2, 4, 128, 2, 3);
  std::ofstream(in / "meta.json") << R"({"num_ranks": 2, "num_experts": 4, "hidden": 128, "num_topk": 2, "num_max_tokens_per_rank": 1000000000})";
  EXPECT_EQ(code_of([&] { replay({"--in", in.string(), "--out", (dir_ / "o").string()}); }, &what), ErrorCode::kCapacityExceeded);
  EXPECT_NE(what.find("the window needs"), std::string::npos) << what;
  fs::remove_all(in);
  make_inputs(in, 2, 4, 128, 2, 3);
  EXPECT_EQ(code_of([&] { replay({"--in", in.string(), "--out", (dir_ / "o").string(), "--worst", "100000000000"}); }, &what),
            ErrorCode::kCapacityExceeded);
  EXPECT_FALSE(fs::exists(dir_ / "o" / "rank0"));
}

// File inputs are read with a bound, and a device or FIFO never blocks (before: a topology
// path of /dev/zero was read forever, a FIFO blocked the open). /dev/zero is only opened for
// reading here; a FIFO in the test's own directory stands for "blocked opening a FIFO".
TEST_F(ReliabilityTest, FileInputsAreBoundedAndNeverBlock) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {std::string("/dev/zero"), fifo.string()}) {
    EXPECT_EQ(in_child([&] {
                try {
                  epx::load_topology(path, 2);
                } catch (const Error& e) {
                  return e.code() == ErrorCode::kIo || e.code() == ErrorCode::kInvalidArgument;
                }
                return false;
              }, 5),
              0)
        << "topology " << path;
  }
  EXPECT_EQ(in_child([&] {
              try {
                epx::tools::read_npy(fifo);
              } catch (const Error& e) {
                return e.code() == ErrorCode::kIo;
              }
              return false;
            }, 5),
            0)
      << "npy FIFO";
  // A meta.json that is a FIFO: refused at once.
  fs::create_directories(dir_ / "in");
  ASSERT_EQ(mkfifo((dir_ / "in" / "meta.json").c_str(), 0600), 0);
  EXPECT_EQ(in_child([&] {
              try {
                epx::tools::read_replay_meta(dir_ / "in");
              } catch (const Error& e) {
                return e.code() == ErrorCode::kIo;
              }
              return false;
            }, 5),
            0);
}

}  // namespace
