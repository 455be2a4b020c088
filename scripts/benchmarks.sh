#!/usr/bin/env bash
# The headline benchmarks, reproducible: every epx figure against its yardstick measured in
# the same run (the one-copy limit, Open MPI, torch gloo), written as BENCHMARKS.md's figure
# tables, a JSON of every figure and an SVG chart (docs/img/benchmarks.svg).
#
#   bash scripts/benchmarks.sh                  # full run (~10 min on 2 cores), in place
#   bash scripts/benchmarks.sh --quick --out D  # tiny sizes, a smoke test (< 2 min), into D
#   bash scripts/benchmarks.sh --only ep-fp8,pp # some steps; the other rows stay as they were
#   bash scripts/benchmarks.sh --list           # the steps
#
# Needs a build (`bash scripts/run.sh build`; --build DIR for another one). The work is in
# scripts/benchmarks.py; this wrapper picks Debian's Python and the build's package.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --build) build=${args[$((i + 1))]:-build} ;;
    --build=*) build=${args[$i]#--build=} ;;
  esac
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 scripts/benchmarks.py "$@"
