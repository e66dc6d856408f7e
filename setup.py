"""pip install . -- qkv's Python module (import qkv), built with CMake and Debian's pybind11.

Inside a virtual environment made with --system-site-packages (NumPy and PyTorch from Debian;
Debian 12's pip refuses to install into the system Python):

    python3 -m venv --system-site-packages ~/venvs/qkv && . ~/venvs/qkv/bin/activate
    pip install .

The build needs what `scripts/install-deps.sh` installs (pybind11-dev and python3-dev among them)
and nothing from a package index. It builds in build/pip (or in QKV_BUILD_DIR, e.g. an existing
build/ directory, which makes it quick). docs/python.md.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.abspath(os.environ.get("QKV_BUILD_DIR") or os.path.join(ROOT, "build", "pip"))
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                                   "-DQKV_BUILD_TESTS=OFF", "-DQKV_BUILD_TOOLS=OFF",
                                   "-DPython3_EXECUTABLE=" + sys.executable])
        subprocess.check_call(["cmake", "--build", build, "--target", "qkv_python"])
        built = glob.glob(os.path.join(build, "python", "qkv", "_qkv*.so"))
        if not built:
            sys.exit("qkv: the build made no Python module (is pybind11-dev installed? scripts/install-deps.sh)")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(
    name="qkv",
    version="0.1.0",
    description="Exact tiled CPU attention with a backward pass, and qkv's transformer models, from Python",
    packages=["qkv"],
    package_dir={"": "python"},
    ext_modules=[Extension("qkv._qkv", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
)
