// Killed and stopped ranks (docs/reliability.md): SIGKILL and SIGSTOP each rank in turn at each phase of a call, and the
// launcher itself. Every other rank fails within the timeout naming the right rank and the
// phase; nothing is left behind (process, /dev/shm segment). The fault is injected by the
// transport's test hook (EPX_FAULT_INJECT="RANK:PHASE:ACTION", control_block.hpp) in a
// forked child that plays the launcher, so the test process itself is never signalled.
//
// Also here: a soak (EPX_SOAK_PAIRS=N, default off): N dispatch/combine pairs with changing
// routing, each bit-exact against the reference (README "Reliability").
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "epx/buffer.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "multirank_support.hpp"

namespace fs = std::filesystem;

namespace epx::testing {
namespace {

constexpr int kP = 3;

ref::Problem fault_problem(std::uint64_t seed = 7) {
  ref::FixtureOptions f;
  f.num_ranks = kP;
  f.num_experts = 6;
  f.num_topk = 3;
  f.hidden = 256;
  f.tokens = 12;
  f.seed = seed;
  return ref::make_problem(f);
}

bool pid_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(f, s);
  const auto close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() && s[close + 2] == 'Z';  // a zombie has ended
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Outcome {
  int launcher_status = -1;       // waitpid status of the launcher child
  std::string error;              // the launch's error message ("" if it returned)
  int origin = -2;                // its origin rank
  std::vector<std::string> rank_error = std::vector<std::string>(kP);  // each rank's own error
  std::vector<int> rank_origin = std::vector<int>(kP, -2);
  std::vector<pid_t> pids = std::vector<pid_t>(kP, 0);
  double seconds = 0;
};

// One launch of kP shm ranks doing a dispatch and a combine, with `fault` injected, in a
// child process; every rank records its pid and its error in `dir`.
Outcome run_with_fault(const std::string& fault, const fs::path& dir, std::chrono::milliseconds timeout) {
  const ref::Problem p = fault_problem();
  const auto want = ref::dispatch_all(p, {});
  std::fflush(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t child = fork();
  if (child == 0) {
    alarm(30);
    signal(SIGINT, SIG_DFL);  // a shell's background job inherits SIGINT ignored
    signal(SIGTERM, SIG_DFL);
    setenv("EPX_FAULT_INJECT", fault.c_str(), 1);
    std::string error;
    int origin = -1;
    try {
      launch({kP, TransportKind::kShm, timeout}, [&](Transport& t) {
        const int r = t.rank();
        std::ofstream(dir / ("pid" + std::to_string(r))) << getpid();
        try {
          Buffer buffer(t, config_for(p));
          const RankViews v = views_of(p, r);
          DispatchResult d = buffer.dispatch(dispatch_args(v, {}));
          const std::vector<std::uint16_t> y = ref::expert_fn(p, want[static_cast<std::size_t>(r)], {});
          CombineArgs ca;
          ca.y = TensorView(y.data(), DType::kBF16, {want[static_cast<std::size_t>(r)].rows, p.hidden});
          ca.handle = &d.handle;
          buffer.combine(ca);
          t.barrier("test end");
        } catch (const Error& e) {
          std::ofstream(dir / ("error" + std::to_string(r))) << e.origin_rank() << "\n" << e.what();
          throw;
        }
      });
    } catch (const Error& e) {
      error = e.what();
      origin = e.origin_rank();
    }
    std::ofstream(dir / "launch") << origin << "\n" << error;
    std::fflush(nullptr);
    _exit(0);
  }
  Outcome o;
  waitpid(child, &o.launcher_status, 0);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto split = [](const std::string& text, int* origin, std::string* msg) {
    const auto nl = text.find('\n');
    if (nl == std::string::npos) return;
    *origin = std::atoi(text.substr(0, nl).c_str());
    *msg = text.substr(nl + 1);
  };
  split(slurp(dir / "launch"), &o.origin, &o.error);
  for (int r = 0; r < kP; ++r) {
    split(slurp(dir / ("error" + std::to_string(r))), &o.rank_origin[static_cast<std::size_t>(r)],
          &o.rank_error[static_cast<std::size_t>(r)]);
    o.pids[static_cast<std::size_t>(r)] = std::atoi(slurp(dir / ("pid" + std::to_string(r))).c_str());
  }
  return o;
}

void expect_nothing_left(const Outcome& o, const std::set<std::string>& before) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (int r = 0; r < kP; ++r) {
    const pid_t pid = o.pids[static_cast<std::size_t>(r)];
    if (pid <= 0) continue;
    while (!pid_gone(pid) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(pid_gone(pid)) << "rank " << r << " (pid " << pid << ") is still running";
  }
  const std::set<std::string> left = segments_left(before);
  EXPECT_TRUE(left.empty()) << "a /dev/shm segment was left: " << *left.begin();
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = fs::temp_directory_path() / ("epx_fault_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path fresh() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::create_directories(dir_);
    return dir_;
  }
  fs::path dir_;
};

// The phases of a call a fault is injected in, as the engine and transport call them ("epilogue"
// has no wait of its own: the engine announces it with Transport::enter_phase).
const char* const kPhases[] = {"allocate: created", "ep create", "dispatch notify", "dispatch data", "epilogue",
                               "combine data"};

TEST_F(FaultTest, KillOrStopEachRankAtEachPhase) {
  const std::chrono::milliseconds timeout(400);
  int fired = 0;
  for (const char* action : {"KILL", "STOP"}) {
    for (const char* phase : kPhases) {
      for (int victim = 0; victim < kP; ++victim) {
        const std::string fault = std::to_string(victim) + ":" + phase + ":" + action;
        SCOPED_TRACE(fault);
        const auto before = epx_segments();
        const Outcome o = run_with_fault(fault, fresh(), timeout);
        ASSERT_TRUE(WIFEXITED(o.launcher_status)) << "the launcher child died";
        if (o.error.empty()) {  // this rank never waited in this phase: counted below
          ADD_FAILURE() << "the fault did not fire";
          continue;
        }
        ++fired;
        const std::string rank = "rank " + std::to_string(victim);
        EXPECT_EQ(o.origin, victim) << o.error;
        EXPECT_NE(o.error.find(rank), std::string::npos) << o.error;
        EXPECT_NE(o.error.find(std::string("in phase '") + phase + "'"), std::string::npos) << o.error;
        EXPECT_NE(o.error.find(std::string(action) == "KILL" ? "SIGKILL" : "SIGSTOP"), std::string::npos) << o.error;
        EXPECT_EQ(o.error.find("out-of-memory killer;"), std::string::npos) << "an OOM claim without evidence: " << o.error;
        // Every other rank failed by itself, naming the victim, well within timeout + grace.
        for (int r = 0; r < kP; ++r) {
          if (r == victim) continue;
          const std::string& e = o.rank_error[static_cast<std::size_t>(r)];
          EXPECT_FALSE(e.empty()) << "rank " << r << " did not fail by itself";
          EXPECT_EQ(o.rank_origin[static_cast<std::size_t>(r)], victim) << "rank " << r << ": " << e;
          EXPECT_NE(e.find(rank), std::string::npos) << "rank " << r << ": " << e;
        }
        EXPECT_LT(o.seconds, 5.0);
        expect_nothing_left(o, before);
      }
    }
  }
  // Each phase must have fired for every rank with both actions (no silent skips).
  EXPECT_EQ(fired, 2 * static_cast<int>(std::size(kPhases)) * kP);
}

// The launcher itself: SIGKILLed, its ranks die with it (PR_SET_PDEATHSIG) and the janitor
// unlinks any segment; SIGTERM / SIGINT: it stops the ranks, cleans up and ends by that signal.
TEST_F(FaultTest, LauncherKilledOrInterrupted) {
  for (const char* action : {"KILL_LAUNCHER", "TERM_LAUNCHER", "INT_LAUNCHER"}) {
    for (const char* phase : {"allocate: created", "dispatch data"}) {
      const std::string fault = std::string("1:") + phase + ":" + action;
      SCOPED_TRACE(fault);
      const auto before = epx_segments();
      const Outcome o = run_with_fault(fault, fresh(), std::chrono::milliseconds(20000));
      ASSERT_TRUE(WIFSIGNALED(o.launcher_status)) << "the launcher was not ended by the signal";
      const int want = std::string(action) == "KILL_LAUNCHER" ? SIGKILL : std::string(action) == "TERM_LAUNCHER" ? SIGTERM : SIGINT;
      EXPECT_EQ(WTERMSIG(o.launcher_status), want);
      EXPECT_LT(o.seconds, 5.0) << "the ranks outlived the launcher";
      expect_nothing_left(o, before);
    }
  }
}

// A rank that stalls before its first transport call (stopped, or blocked reading an input)
// is the one named: the others' bootstrap barrier names the lowest rank that has not arrived.
TEST_F(FaultTest, RankStalledAtStartupIsNamed) {
  const fs::path dir = fresh();
  const auto before = epx_segments();
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    alarm(30);
    std::string error;
    int origin = -1;
    try {
      launch({kP, TransportKind::kShm, std::chrono::milliseconds(400)}, [&](Transport& t) {
        std::ofstream(dir / ("pid" + std::to_string(t.rank()))) << getpid();
        if (t.rank() == 2) raise(SIGSTOP);  // stalls while loading its inputs
        Buffer buffer(t, config_for(fault_problem()));
      });
    } catch (const Error& e) {
      error = e.what();
      origin = e.origin_rank();
    }
    std::ofstream(dir / "launch") << origin << "\n" << error;
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const std::string text = slurp(dir / "launch");
  EXPECT_EQ(text.substr(0, text.find('\n')), "2") << text;
  EXPECT_NE(text.find("rank 2 was stopped by signal 19 (SIGSTOP) in phase 'startup'"), std::string::npos) << text;
  Outcome o;
  for (int r = 0; r < kP; ++r) o.pids[static_cast<std::size_t>(r)] = std::atoi(slurp(dir / ("pid" + std::to_string(r))).c_str());
  expect_nothing_left(o, before);
}

// A /dev/shm too small for the window (a private 2 MiB tmpfs in a private mount namespace,
// root only): every rank fails with the sizes, before any segment is made; before, a rank
// died of SIGBUS at the first touch of its segment.
TEST_F(FaultTest, FullDevShmIsAnErrorOnEveryRankNotSigbus) {
  const fs::path dir = fresh();
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    alarm(30);
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=2m") != 0)
      _exit(77);  // not root / no mount namespaces: skipped
    ref::FixtureOptions f;
    f.num_ranks = 2, f.num_experts = 4, f.num_topk = 2, f.hidden = 4096, f.tokens = 64;
    const ref::Problem p = ref::make_problem(f);
    std::string error;
    try {
      launch({2, TransportKind::kShm, std::chrono::milliseconds(5000)}, [&](Transport& t) {
        try {
          Buffer buffer(t, config_for(p));
        } catch (const Error& e) {
          std::ofstream(dir / ("error" + std::to_string(t.rank()))) << e.what();
          throw;
        }
      });
    } catch (const Error& e) {
      error = e.what();
    }
    std::ofstream(dir / "launch") << error;
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "needs root and mount namespaces";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string error = slurp(dir / "launch");
  EXPECT_NE(error.find("/dev/shm has"), std::string::npos) << error;
  EXPECT_EQ(error.find("signal 7"), std::string::npos) << error;
  for (int r = 0; r < 2; ++r) {
    const std::string e = slurp(dir / ("error" + std::to_string(r)));
    EXPECT_NE(e.find("the window needs"), std::string::npos) << "rank " << r << ": " << e;
  }
}

// The soak: EPX_SOAK_PAIRS dispatch/combine pairs (e.g. 10000) on 4 shm ranks, the routing
// changing every call (16 problems of one shape), every result bit-exact against the reference.
TEST(Soak, DispatchCombineBitExactWithChangingRouting) {
  const char* env = std::getenv("EPX_SOAK_PAIRS");
  if (env == nullptr) GTEST_SKIP() << "set EPX_SOAK_PAIRS=N to run the soak (README: Reliability)";
  const long pairs = std::atol(env);
  constexpr int P = 4, kRoutings = 16;
  std::vector<ref::Problem> problems;
  std::vector<std::vector<ref::DispatchOut>> want;
  std::vector<std::vector<std::vector<std::uint16_t>>> y, combined;
  for (int i = 0; i < kRoutings; ++i) {
    ref::FixtureOptions f;
    f.num_ranks = P, f.num_experts = 16, f.num_topk = 4, f.hidden = 256, f.tokens = 24, f.seed = 1000 + i;
    f.zipf = (i % 4) * 0.5;
    problems.push_back(ref::make_problem(f));
    want.push_back(ref::dispatch_all(problems.back(), {}));
    y.emplace_back();
    combined.emplace_back();
    for (int r = 0; r < P; ++r) y.back().push_back(ref::expert_fn(problems.back(), want.back()[static_cast<std::size_t>(r)], {}));
    for (int r = 0; r < P; ++r)
      combined.back().push_back(ref::combine(problems.back(), {}, want.back(), y.back(), nullptr, nullptr, false, r));
  }
  launch({P, TransportKind::kShm, std::chrono::milliseconds(60000)}, [&](Transport& t) {
    const int r = t.rank();
    const auto ur = static_cast<std::size_t>(r);
    Buffer buffer(t, config_for(problems[0]));
    for (long call = 0; call < pairs; ++call) {
      const auto i = static_cast<std::size_t>(call % kRoutings);
      const ref::Problem& p = problems[i];
      DispatchResult d = buffer.dispatch(dispatch_args(views_of(p, r), {}));
      expect_dispatch(r, p, {}, want[i][ur], d);
      CombineArgs ca;
      ca.y = TensorView(y[i][ur].data(), DType::kBF16, {want[i][ur].rows, p.hidden});
      ca.handle = &d.handle;
      const CombineResult c = buffer.combine(ca);
      expect_bits(r, "combined_x (call " + std::to_string(call) + ")", c.combined_x.data(), combined[i][ur]);
    }
  });
}

}  // namespace
}  // namespace epx::testing
