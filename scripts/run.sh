#!/usr/bin/env bash
# The one entry point of the README: installs what epx needs (Debian 12 packages), builds,
# and runs the main job or the tests.
#
#   bash scripts/run.sh bench [epx bench options]   # the main job: epx bench, shm transport
#   bash scripts/run.sh test                        # unit + multi-rank tests, e2e replay check
#   bash scripts/run.sh sanitize                    # multi-rank tests under TSan and ASan
#   bash scripts/run.sh build                       # just install + build (build/)
#   bash scripts/run.sh benchmarks [options]        # scripts/benchmarks.sh: BENCHMARKS.md's figures
#   bash scripts/run.sh fuzz                        # libFuzzer targets, ASan + UBSan, bounded time (build-fuzz/)
#   bash scripts/run.sh soak                        # 10^4 dispatch/combine pairs, bit-exact (not in `test`)
#   bash scripts/run.sh cross                       # the kernels and their tests for aarch64, run under qemu (build-aarch64/)
set -euo pipefail
cd "$(dirname "$0")/.."

# `bench` (the main job) needs only the compiler and the libraries the `epx` tool links.
BENCH_PACKAGES=(cmake ninja-build g++ libcli11-dev nlohmann-json3-dev libhwy-dev)
# Everything else (`test`, `build`, `sanitize`, ...): the test frameworks, Open MPI with OpenSHMEM
# (the shmem transport and the MPI peers), the Python package's build and runtime, packaging.
PACKAGES=("${BENCH_PACKAGES[@]}" libgtest-dev libbenchmark-dev libfmt-dev
          python3-numpy libopenmpi-dev openmpi-bin libucx-dev ucx-utils iproute2 util-linux
          python3-dev pybind11-dev python3-pybind11 libdlpack-dev python3-torch python3-pytest
          python3-setuptools python3-wheel python3-build python3-venv python3-pip
          chromium)  # chromium: the HTML reports opened headless by `test` (~350 MB, ~1.5 min to install)
JOBS=${EPX_JOBS:-2}
# ccache (when installed) shares objects between checkouts of the tree: paths relative to it.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

# `cross` only: the aarch64 cross compiler (with its libc and libstdc++) and qemu-user.
CROSS_PACKAGES=(g++-aarch64-linux-gnu qemu-user)

# `fuzz` only: clang with libFuzzer and the sanitizer runtimes.
FUZZ_PACKAGES=(clang-14 libclang-rt-14-dev)

# install_deps [packages...]: the given packages (default: PACKAGES) that are not installed yet.
install_deps() {
  local missing=() want=("$@")
  [ ${#want[@]} -eq 0 ] && want=("${PACKAGES[@]}")
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "epx: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# build_progress WHAT: ninja's output on stdin; "[n/N] ..." lines become one line per 10 % on
# stderr, anything else (a compiler's errors) passes through. Read line by line, so the
# progress shows as it happens.
build_progress() {
  local line n total last=0 p
  while IFS= read -r line; do
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
      n=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
      p=$(( n * 10 / total ))
      if [ "$p" -gt "$last" ]; then last=$p; echo "epx: build $(( p * 10 )) % ($n/$total)" >&2; fi
    elif [ "$line" = "ninja: no work to do." ]; then
      echo "epx: $1 is up to date" >&2
    else
      printf '%s\n' "$line"
    fi
  done
}

# build DIR [cmake args...] [-- targets...]
build() {
  local dir=$1; shift
  local args=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift && targets=("$@")
  echo "epx: configuring $dir" >&2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${args[@]}" >/dev/null
  local what="${targets[*]:-everything}"
  echo "epx: building $what in $dir ($JOBS jobs; progress every 10 %)" >&2
  # ninja's "[n/N] ..." lines thinned to one per 10 % (errors pass through whole).
  cmake --build "$dir" -j "$JOBS" ${targets[@]+--target "${targets[@]}"} 2>&1 | build_progress "$what"
}

# A `bench` configures build/ without the tests or debug information (fewer packages, less to
# compile); the first `test` or `build` after it configures afresh with everything found.
full_configure() {
  if grep -qs '^EPX_BUILD_TESTS:BOOL=OFF' build/CMakeCache.txt; then rm -f build/CMakeCache.txt; fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    install_deps
    full_configure
    build build -DEPX_BUILD_TESTS=ON
    ;;
  bench)
    install_deps "${BENCH_PACKAGES[@]}"
    # Only the `epx` tool, without debug information (the same -O3 code, ~1/3 less compile
    # time); a tree already configured with its tests (by `test` or `build`) is used as it is.
    if [ -f build/CMakeCache.txt ]; then build build -- epx
    else build build -DEPX_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release -- epx; fi
    exec ./build/src/tools/epx bench "$@"
    ;;
  test)
    install_deps
    full_configure
    build build -DEPX_BUILD_TESTS=ON
    # The Python package from this build tree: nothing is written into the system Python.
    export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
    ctest --test-dir build --output-on-failure -j "$JOBS"
    # The Python package (Debian's Python; pytest exit 5 = no tests collected is not a failure);
    # the torch.distributed backend's programs under torchrun and a subset of torch's own suite
    # included. ~150 s.
    timeout 600 /usr/bin/python3 -m pytest -q tests/python || [ $? -eq 5 ]
    # The runner of DeepEP's own test files (tests/deepep), on a made-up DeepEP checkout: counted
    # checks, --keep-going, a failing rank, a hung test killed with its ranks. ~55 s.
    timeout 300 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/deepep/test_run_deepep.py
    # Every code block of README.md and docs/getting-started.md as printed (results checked), the
    # README's figures against docs/img/benchmarks.json, and a lint of the tree (no issue
    # numbers, no contract outside docs/spec.md). ~70 s.
    timeout 600 /usr/bin/python3 tests/docs/check_docs.py --build build
    # scripts/benchmarks.sh --quick into a temp dir: every figure a positive ratio or skipped with
    # its reason, a table row per op, a chart that parses. ~30 s.
    timeout 300 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/docs/test_benchmarks_script.py
    # ... and installed like any Python package: pip install . and a wheel, in fresh venvs.
    timeout 420 bash tests/packaging/check_install.sh build
    # C++ users: cmake --install, then a project of its own finds it (tests/consumer).
    rm -rf build/install-test build/consumer
    cmake --install build --prefix "$PWD/build/install-test" >/dev/null
    cmake -S tests/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install-test" >/dev/null
    timeout 300 cmake --build build/consumer >/dev/null
    timeout 60 ./build/consumer/epx_consumer
    /usr/bin/python3 tests/e2e/test_epx_ref.py
    /usr/bin/python3 tests/e2e/check_replay.py --epx build/src/tools/epx
    /usr/bin/python3 tests/e2e/check_bench_modes.py --epx build/src/tools/epx  # push, pull, rings: no warnings
    # epx::Diagnose against real faults: a stopped / CPU-starved rank named, quiet runs clean, a slow link
    # between 4 namespace machines (one veth shaped) named as its points, the same machines unshaped clean
    # (SKIPs what it cannot make: cgroup, namespaces without root). It judges the persistent verdict
    # per rank and link (named in 3 of the loop's 5 intervals, either op). A failed check is rerun up
    # to 3 times and fails only if each rerun repeats a wrong verdict of the first: by the single-run
    # rates in docs/diagnose.md ("Tested with real faults") a failure by chance is < 1 in 1000. 100-250 s.
    timeout 600 /usr/bin/python3 tests/e2e/check_diagnose.py --epx build/src/tools/epx --only quiet,sigstop,cgroup,netem,netem-quiet --confirm 3
    bash tests/e2e/check_mpi_baseline.sh build/baselines/epx_mpi_baseline  # says SKIP without Open MPI
    # epx bench/sim --html and epx html opened in headless Chromium: no console error, every chart drawn; screenshots in build/html/.
    timeout 300 /usr/bin/python3 tests/html/check_pages.py --epx build/src/tools/epx --out build/html
    # shmem across network namespaces: every case, the faults, healing and joins from spare PEs; SKIP without root
    timeout 900 bash tests/multinode/run.sh build
    # The torch.distributed backend across 2 namespace machines under torchrun (UCX transport):
    # every op, the DDP loop, the MoE layer and the pipeline, a rank killed, the link cut. ~150 s.
    timeout 900 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/multinode/test_torchrun.py
    # Healing across machines on a UCX group: a rank of the other machine killed mid-dispatch,
    # the survivors agree through the torch store and go on bit for bit, a replacement joins. ~70 s.
    timeout 600 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/multinode/test_elastic_ucx.py
    # Healing from Python on an OpenSHMEM group under oshrun (2 x 2 namespace machines): a rank
    # killed inside a combine, the survivors rebuild and go on bit for bit, the job ends by itself. ~20 s.
    timeout 400 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/multinode/test_heal_shmem.py
    ;;
  benchmarks)
    # BENCHMARKS.md's figures, docs/img/benchmarks.{json,svg}: the headline set against its peers.
    install_deps
    full_configure
    build build -DEPX_BUILD_TESTS=ON
    exec bash scripts/benchmarks.sh "$@"
    ;;
  sanitize)
    install_deps
    # ThreadSanitizer: ranks as threads (fork under TSan is not supported).
    build build-tsan -DEPX_SANITIZER=thread -- epx_multirank_tests
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ./build-tsan/tests/epx_multirank_tests --gtest_filter='*threads*:*Errors*:*deferred*:*Deferred*-*shm*' --gtest_brief=1
    # AddressSanitizer + UBSan: the library's unit tests and every transport; the data-plane combinations (the same engine
    # code on each transport, all run by `test`) only on threads, to keep CI within its time.
    build build-asan -DEPX_SANITIZER=address -- epx_multirank_tests epx_unit_tests epx_recipe_tests
    ASAN_OPTIONS="detect_leaks=1" ./build-asan/tests/epx_multirank_tests --gtest_brief=1 \
      --gtest_filter='-EveryCombination/*shm*:EveryCombination/*sim*'
    ASAN_OPTIONS="detect_leaks=1" ./build-asan/tests/epx_unit_tests --gtest_brief=1
    # The recipes' toy path, protocol and buffer kind, registered from outside the library.
    ASAN_OPTIONS="detect_leaks=1" ./build-asan/tests/epx_recipe_tests --gtest_brief=1
    ;;
  cross)
    install_deps "${CROSS_PACKAGES[@]}"
    # The kernels alone (tests/cross: src/core, reduce_row and their unit tests; no engine),
    # cross-compiled for aarch64 and run under qemu-user: bit for bit as on x86 (docs/spec.md §1/§4).
    cmake -S tests/cross -B build-aarch64 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" >/dev/null
    cmake --build build-aarch64 -j "$JOBS"
    timeout 600 qemu-aarch64 -L /usr/aarch64-linux-gnu build-aarch64/epx_kernel_tests --gtest_brief=1
    ;;
  fuzz)
    install_deps "${FUZZ_PACKAGES[@]}"
    # A separate tree: the whole library with clang, ASan + UBSan and libFuzzer's coverage.
    build build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DEPX_FUZZ=ON -DEPX_BUILD_TESTS=OFF \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -- epx_fuzz
    # Each target for EPX_FUZZ_SECONDS (default 20; 5 targets = 100 s) from the committed seed corpus
    # (copied: the run's finds stay out of the tree). Any crash, sanitizer report, leak, hang
    # (-timeout, seconds per input) or excess memory (-rss_limit_mb) fails the run; the final
    # stats (executions, cov: edges, ft: features) go to build-fuzz/fuzz_stats.txt.
    # A fixed seed (EPX_FUZZ_SEED, default 1): CI explores the same inputs in the same order as the run that landed.
    secs=${EPX_FUZZ_SECONDS:-20}
    : > build-fuzz/fuzz_stats.txt
    # EPX_FUZZ_TARGETS="..." picks the targets (fuzz_replay found a null-pointer offset in the
    # engine's combine, fixed; docs/reliability.md).
    for t in ${EPX_FUZZ_TARGETS:-fuzz_npy fuzz_meta fuzz_topology fuzz_bench_routing fuzz_replay}; do
      work=$(mktemp -d); cp -r "fuzz/corpus/$t/." "$work/"
      echo "fuzz: $t for ${secs} s" >&2
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
        timeout $((secs + 60)) "./build-fuzz/fuzz/$t" -max_total_time="$secs" -seed="${EPX_FUZZ_SEED:-1}" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix=build-fuzz/"$t"- "$work" > "build-fuzz/$t.log" 2>&1 \
        || { tail -40 "build-fuzz/$t.log" >&2; rm -rf "$work"; echo "fuzz: $t FAILED (artifact in build-fuzz/)" >&2; exit 1; }
      rm -rf "$work"
      { echo "$t: $(grep -E '^#[0-9]+.*(DONE|pulse)' "build-fuzz/$t.log" | tail -1)"
        grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "build-fuzz/$t.log"; } >> build-fuzz/fuzz_stats.txt
    done
    cat build-fuzz/fuzz_stats.txt
    ;;
  soak)
    install_deps
    full_configure
    build build -- epx_multirank_tests
    EPX_SOAK_PAIRS=${EPX_SOAK_PAIRS:-10000} ./build/tests/epx_multirank_tests --gtest_filter='Soak.*'
    ;;
  *)
    echo "usage: bash scripts/run.sh {bench [options]|test|benchmarks [options]|sanitize|fuzz|soak|cross|build}" >&2
    exit 2
    ;;
esac
