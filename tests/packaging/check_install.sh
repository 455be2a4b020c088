#!/usr/bin/env bash
# epx installed, tested from outside the checkout:
#   0. `cmake --install BUILD_DIR` into a temporary prefix: the headers installed are exactly
#      include/epx/ (what a library user includes), none of the tools' (tools/include/), and
#      each compiles on its own with only the prefix on the include path;
# and like any Python package:
#   1. `pip install --no-build-isolation .` into a fresh venv (Debian's Python with its
#      torch and numpy: --system-site-packages), the module built in the existing build
#      tree BUILD_DIR (nothing compiled twice), and a subset of tests/python run against it;
#   2. `python3 -m build --no-isolation` (an sdist, then a wheel built from it: CMake in a
#      directory of its own, ccache sharing the objects), the wheel installed into a second
#      venv and tested there.
# Everything but BUILD_DIR's own target happens in a temporary directory, removed after.
# usage: bash tests/packaging/check_install.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: check_install.sh BUILD_DIR}" && pwd)
py=/usr/bin/python3
unset PYTHONPATH  # the venvs' own package, not the build tree's that `run.sh test` exports
tmp=$(mktemp -d /tmp/epx-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "check_install: cmake --install, every installed header on its own"
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
inc="$tmp/prefix/include"
diff <(cd "$root/include" && find epx -type f | sort) <(cd "$inc" && find epx -type f | sort) \
  || { echo "check_install: the installed headers are not include/epx/ (above: < not installed, > extra)"; exit 1; }
tool_headers=$(cd "$root/tools/include" && find epx -type f | sort)
[ -n "$tool_headers" ] || { echo "check_install: no tool header found under tools/include"; exit 1; }
for h in $tool_headers; do
  [ ! -e "$inc/$h" ] || { echo "check_install: tool header $h installed"; exit 1; }
done
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
headers=$(cd "$inc" && find epx -name '*.hpp' | sort)
n=$(echo "$headers" | wc -l)
# One translation unit per header, nothing before it: a header that leans on an include of
# its includer fails here. Two at a time.
echo "$headers" | CXX="${cxx:-c++}" INC="$inc" xargs -P 2 -I{} sh -c \
  'printf "#include <%s>\n" "$1" | "$CXX" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -I"$INC" -x c++ - \
   || { echo "check_install: $1 does not compile on its own"; exit 255; }' sh {}
echo "check_install: $n installed headers, each compiles alone; none of the tools'"

if ! "$py" -c "import build, setuptools, wheel, venv" 2>/dev/null; then
  echo "check_install: SKIP (needs python3-build python3-setuptools python3-wheel python3-venv)"; exit 0
fi

# A copy of the sources: setuptools writes egg-info and build directories next to them.
tar -C "$root" --exclude=./.git --exclude='./build*' -cf - . | (mkdir "$tmp/src" && tar -C "$tmp/src" -xf -)
# The tests and what they read, outside the checkout; the package comes from the venv.
mkdir -p "$tmp/run/tests" "$tmp/run/docs"
cp -r "$root/tests/python" "$root/tests/e2e" "$tmp/run/tests/" && cp "$root/docs/deepep.md" "$tmp/run/docs/"

run_tests() {  # venv, pytest files...
  local venv=$1; shift
  (cd "$tmp/run" && "$venv/bin/python" -c "import epx, sys; assert epx.__file__.startswith('$venv'), epx.__file__; \
print('check_install: epx', epx.__version__, 'from', epx.__file__)" \
   && EPX_TEST_INSTALLED=1 timeout 300 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@")
}

echo "check_install: pip install . into a fresh venv"
"$py" -m venv --system-site-packages "$tmp/venv"
EPX_CMAKE_BUILD_DIR="$build" "$tmp/venv/bin/python" -m pip install -q --no-build-isolation --no-index "$tmp/src"
run_tests "$tmp/venv" tests/python/test_package.py tests/python/test_deepep_table.py \
  tests/python/test_epbuffer_sizes.py tests/python/test_deepep_style.py

echo "check_install: python3 -m build --no-isolation, the wheel into another venv"
(cd "$tmp/src" && "$py" -m build --no-isolation --outdir "$tmp/dist" . >"$tmp/build.log" 2>&1) \
  || { tail -40 "$tmp/build.log"; exit 1; }
ls "$tmp"/dist/epx-*.tar.gz "$tmp"/dist/epx-*.whl >/dev/null
"$py" -m venv --system-site-packages "$tmp/venv2"
"$tmp/venv2/bin/python" -m pip install -q --no-index "$tmp"/dist/epx-*.whl
rm -rf "$tmp/src"  # the wheel stands alone
run_tests "$tmp/venv2" tests/python/test_package.py tests/python/test_deepep_table.py
echo "check_install: OK"
