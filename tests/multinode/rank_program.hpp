// What every multinode rank program (tests/multinode/*_rank.cpp, started by oshrun from
// tests/multinode/run.sh) does first and last: read its options, join the job and connect
// the shmem transport, and end the process on an error through epx's exit handlers.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>

#include "epx/connect.hpp"
#include "epx/shmem.hpp"

namespace epx::testing {

/// The command line: `--name value` options (only the names in `valued`) and `--name`
/// switches (only those in `switches`); anything else is an error naming the option.
class RankOptions {
 public:
  RankOptions(int argc, char** argv, std::set<std::string> valued, std::set<std::string> switches) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (switches.count(a)) {
        switches_.insert(a);
      } else if (valued.count(a)) {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        values_[a] = argv[++i];
      } else {
        throw std::invalid_argument("unknown option " + a);
      }
    }
  }
  std::string value(const std::string& name, const std::string& fallback) const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  bool has(const std::string& name) const { return switches_.count(name) > 0; }
  /// --timeout-ms N (default 20 s): every wait of the transport.
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(std::stol(value("--timeout-ms", "20000"))); }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;
};

/// The shmem transport over an oshrun job's bootstrap (collective: every PE calls it).
inline std::unique_ptr<Transport> connect_shmem(Bootstrap& boot, std::chrono::milliseconds timeout) {
  ConnectOptions co;
  co.kind = ConnectKind::kShmem;
  co.timeout = timeout;
  return connect(boot, co);
}

/// main(): `body`'s status, or 1 with the error on stderr, named by `program`, by
/// std::exit: the unwinding already tore down what it could (a transport that failed makes
/// no call over every PE), and the exit handlers end the job. After a failure epx's
/// handler ends the process before liboshmem's finalize (a barrier over every PE, which
/// never completes once a PE died or a link was cut) and the launcher ends the job; after
/// the survivors agreed on a loss (epx/elastic.hpp) epx ends the job at once (a process
/// that just vanishes then leaves oshrun waiting for the dead PE).
inline int rank_main(const char* program, int argc, char** argv, int (*body)(int, char**)) {
  try {
    return body(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    std::fflush(stderr);
    std::exit(1);
  }
}

}  // namespace epx::testing
