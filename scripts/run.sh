#!/usr/bin/env bash
# The one entry point of the README: installs what epx needs (Debian 12 packages), builds,
# and runs the main job or the tests.
#
#   bash scripts/run.sh bench [epx bench options]   # the main job: epx bench, shm transport
#   bash scripts/run.sh test                        # unit + multi-rank tests, e2e replay check
#   bash scripts/run.sh sanitize                    # multi-rank tests under TSan and ASan
#   bash scripts/run.sh build                       # just install + build (build/)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake ninja-build g++ libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev
          python3-numpy libopenmpi-dev openmpi-bin
          python3-dev pybind11-dev python3-pybind11 libdlpack-dev python3-torch python3-pytest)
JOBS=${EPX_JOBS:-2}
# ccache (when installed) shares objects between checkouts of the tree: paths relative to it.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "epx: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# build DIR [cmake args...] [-- targets...]
build() {
  local dir=$1; shift
  local args=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift && targets=("$@")
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${args[@]}" >/dev/null
  if [ ${#targets[@]} -gt 0 ]; then
    cmake --build "$dir" -j "$JOBS" --target "${targets[@]}"
  else
    cmake --build "$dir" -j "$JOBS"
  fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    install_deps
    build build
    ;;
  bench)
    install_deps
    build build >/dev/null
    exec ./build/src/tools/epx bench "$@"
    ;;
  test)
    install_deps
    build build
    ctest --test-dir build --output-on-failure -j "$JOBS"
    # The Python package (Debian's Python; pytest exit 5 = no tests collected is not a failure).
    timeout 300 /usr/bin/python3 -m pytest -q tests/python || [ $? -eq 5 ]
    # C++ users: cmake --install, then a project of its own finds it (tests/consumer).
    rm -rf build/install-test build/consumer
    cmake --install build --prefix "$PWD/build/install-test" >/dev/null
    cmake -S tests/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install-test" >/dev/null
    timeout 300 cmake --build build/consumer >/dev/null
    timeout 60 ./build/consumer/epx_consumer
    /usr/bin/python3 tests/e2e/test_epx_ref.py
    /usr/bin/python3 tests/e2e/check_replay.py --epx build/src/tools/epx
    /usr/bin/python3 tests/e2e/check_bench_modes.py --epx build/src/tools/epx  # push, pull, rings: no warnings
    bash tests/e2e/check_mpi_baseline.sh build/bench/epx_mpi_baseline  # says SKIP without Open MPI
    ;;
  sanitize)
    install_deps
    # ThreadSanitizer: ranks as threads (fork under TSan is not supported).
    build build-tsan -DEPX_SANITIZER=thread -- epx_multirank_tests
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ./build-tsan/tests/epx_multirank_tests --gtest_filter='*threads*:*Errors*:*deferred*:*Deferred*-*shm*' --gtest_brief=1
    # AddressSanitizer + UBSan: the library's unit tests and every transport; the data-plane combinations (the same engine
    # code on each transport, all run by `test`) only on threads, to keep CI within its time.
    build build-asan -DEPX_SANITIZER=address -- epx_multirank_tests epx_unit_tests
    ASAN_OPTIONS="detect_leaks=1" ./build-asan/tests/epx_multirank_tests --gtest_brief=1 \
      --gtest_filter='-EveryCombination/*shm*:EveryCombination/*sim*'
    ASAN_OPTIONS="detect_leaks=1" ./build-asan/tests/epx_unit_tests --gtest_brief=1
    ;;
  *)
    echo "usage: bash scripts/run.sh {bench [options]|test|sanitize|build}" >&2
    exit 2
    ;;
esac
