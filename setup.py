"""Builds the extension actcap._core with CMake (see pyproject.toml for the package itself).

The extension links LibTorch and torch's Python bindings, so it is built against the torch of the
interpreter running pip: `pip install --no-build-isolation .` (build isolation would fetch another
torch). CMake finds LibTorch through that torch (torch.utils.cmake_prefix_path, for pip's torch)
or the system's (Debian's libtorch-dev beside python3-torch).

Environment:
  ACTCAP_BUILD_DIR   reuse this CMake build folder (e.g. the `make build` one, build/) when it was
                     configured for the same Python: only the extension target is built there
  ACTCAP_CMAKE_ARGS  extra arguments for CMake's configure step
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: every core)
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def _cached(build_dir, key):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def _same_python(executable):
    """Whether `executable` is an interpreter with this one's extension ABI."""
    if not executable or not os.path.exists(executable):
        return False
    probe = "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"
    out = subprocess.run([executable, "-c", probe], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == sysconfig.get_config_var("EXT_SUFFIX")


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        reuse = os.environ.get("ACTCAP_BUILD_DIR")
        if reuse:
            build_dir = os.path.abspath(reuse)
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                sys.exit(f"ACTCAP_BUILD_DIR={reuse} is not a configured CMake build folder "
                         "(run `make build`, or unset ACTCAP_BUILD_DIR)")
            if not _same_python(_cached(build_dir, "Python_EXECUTABLE")):
                sys.exit(f"ACTCAP_BUILD_DIR={reuse} was configured for another Python than "
                         f"{sys.executable}; unset ACTCAP_BUILD_DIR to build from scratch")
        else:
            build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
            self._configure(build_dir)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "actcap_python",
                               "-j", jobs])
        built = os.path.join(build_dir, "python", "actcap",
                             "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not os.path.exists(built):
            sys.exit(f"CMake built no {built}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)

    def _configure(self, build_dir):
        if shutil.which("cmake") is None:
            sys.exit("actcap needs CMake >= 3.18 to build (Debian: apt-get install cmake)")
        import torch.utils  # the torch the extension is built against

        prefixes = [p for p in [torch.utils.cmake_prefix_path] if os.path.isdir(p)]
        if os.environ.get("CMAKE_PREFIX_PATH"):
            prefixes.append(os.environ["CMAKE_PREFIX_PATH"])
        args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                f"-DPython_EXECUTABLE={sys.executable}", "-DACTCAP_BUILD_TESTS=OFF",
                "-DACTCAP_BUILD_BENCH=OFF"]
        if prefixes:
            args.append("-DCMAKE_PREFIX_PATH=" + ";".join(prefixes))
        args += shlex.split(os.environ.get("ACTCAP_CMAKE_ARGS", ""))
        subprocess.check_call(args)


setup(
    ext_modules=[CMakeExtension("actcap._core")],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own build folder, apart from `make build`'s build/ tree
    options={"build": {"build_base": os.path.join("build", "pip")}},
)
