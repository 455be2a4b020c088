"""The C++ half of `pip install .` and `python3 -m build` (pyproject.toml holds the rest):
builds epx's pybind11 module `_epx` with CMake and puts it into the package.

The module links epx's static libraries and only Debian's shared ones, so the wheel does
not depend on this checkout. Environment:
  EPX_CMAKE_BUILD_DIR  an existing build tree to build `_epx` in (e.g. `build`, what
                       `bash scripts/run.sh build` made): nothing is compiled twice
                       (default: build-py/ next to this file, configured here)
  EPX_CMAKE_ARGS       extra CMake arguments for a fresh configure (e.g. -DEPX_WERROR=OFF)
  EPX_JOBS             parallel compile jobs (2)
ccache, when installed, shares objects with other build trees of the same sources
(CCACHE_BASEDIR is this directory, as in scripts/run.sh).
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        env = dict(os.environ, CCACHE_BASEDIR=ROOT, CCACHE_NOHASHDIR="1")
        tree = os.environ.get("EPX_CMAKE_BUILD_DIR") or os.path.join(ROOT, "build-py")
        tree = os.path.abspath(tree)
        if not os.path.exists(os.path.join(tree, "CMakeCache.txt")):
            # the flags of scripts/run.sh build (so ccache finds its objects), no tests
            subprocess.run(["cmake", "-S", ROOT, "-B", tree, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                            "-DEPX_BUILD_TESTS=OFF", f"-DPython3_EXECUTABLE={sys.executable}"]
                           + shlex.split(os.environ.get("EPX_CMAKE_ARGS", "")), check=True, env=env)
        subprocess.run(["cmake", "--build", tree, "-j", os.environ.get("EPX_JOBS", "2"), "--target", "_epx"],
                       check=True, env=env)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(tree, "python", "epx", "_epx" + suffix)
        if not os.path.exists(built):
            raise RuntimeError(f"epx: {built} was not built: the build tree {tree} is for another Python "
                               f"(found {glob.glob(os.path.join(tree, 'python', 'epx', '_epx*'))})")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)
        if shutil.which("strip"):  # the debug info stays in the build tree
            subprocess.run(["strip", "--strip-debug", dest], check=True)


setup(ext_modules=[Extension("epx._epx", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": os.path.join("build-py", "setuptools")}})
