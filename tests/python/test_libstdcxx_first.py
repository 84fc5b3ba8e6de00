"""cmake/LibstdcxxFirst.cmake against the hazard it exists for (pytorch/pytorch#133437): a shared
library linked before libstdc++ that exports its own copy of a libstdc++ symbol, as pip's LibTorch
does. Here a stand-in, libfake.so, exports std::filesystem::remove_all returning 4242 (libstdc++'s
returns 0 for a path that does not exist). Without the module a program linking it (and a module
loaded into Python) calls the stand-in; with it, libstdc++'s. Both with this machine's compiler
and with a compiler that has only libstdc++.a, as the GPU image's GCC: there `-lstdc++` links the
archive, so the stand-in is the only shared definition, and the module must find libstdc++.so.6
elsewhere."""
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import actcap_helpers as H

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "cmake" / "LibstdcxxFirst.cmake"
FAKE = 4242


@pytest.fixture(autouse=True)
def tools():
    if not (shutil.which("cmake") and shutil.which("c++") and shutil.which("readelf")):
        H.skip_or_fail("cmake, c++ and readelf are needed")


PROJECT = textwrap.dedent(f"""\
    cmake_minimum_required(VERSION 3.16)
    project(libstdcxx_first CXX)
    set(CMAKE_CXX_STANDARD 17)
    include({MODULE.as_posix()})
    # libfake stands in for libtorch: shared, linked before libstdc++, exporting a copy of a std symbol
    add_library(fake SHARED fake.cpp)
    add_library(core STATIC core.cpp)
    set_target_properties(core PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_link_libraries(core PUBLIC fake)
    actcap_link_libstdcxx_first(core)
    add_executable(prog main.cpp)
    target_link_libraries(prog PRIVATE core)
    add_library(mod MODULE mod.cpp)
    target_link_libraries(mod PRIVATE core)
    """)

SOURCES = {
    "fake.cpp": f"""
        #include <cstdint>
        #include <filesystem>
        namespace std::filesystem {{
        // the stand-in's copy: what libtorch's exported copies are to actcap
        __attribute__((weak)) std::uintmax_t remove_all(const path&) {{ return {FAKE}; }}
        }}
        extern "C" int fake_loaded() {{ return 1; }}
        """,
    "core.cpp": """
        #include <cstdint>
        #include <filesystem>
        extern "C" int fake_loaded();
        extern "C" long core_remove_all() {
          fake_loaded();  // core needs libfake, as actcap needs libtorch
          return static_cast<long>(std::filesystem::remove_all("/nonexistent/actcap-libstdcxx"));
        }
        """,
    "main.cpp": """
        #include <cstdio>
        extern "C" long core_remove_all();
        int main() { std::printf("%ld\\n", core_remove_all()); }
        """,
    "mod.cpp": """
        extern "C" long core_remove_all();
        extern "C" long mod_remove_all() { return core_remove_all(); }
        """,
}


def static_only_compiler(tmp):
    """A c++ that behaves like the GPU image's GCC: no shared libstdc++ in its search paths, so
    -lstdc++ links libstdc++.a and -print-file-name=libstdc++.so answers a bare name."""
    archive = subprocess.run(["c++", "-print-file-name=libstdc++.a"], capture_output=True,
                             text=True).stdout.strip()
    if not os.path.isabs(archive):
        H.skip_or_fail("this compiler has no libstdc++.a")
    only = tmp / "static-only"
    only.mkdir()
    (only / "libstdc++.a").symlink_to(archive)
    wrapper = tmp / "c++-static-libstdcxx"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        for a in "$@"; do
          case $a in -print-file-name=libstdc++.so*) echo "${{a#-print-file-name=}}"; exit 0 ;; esac
        done
        exec {shutil.which("c++")} -B{only}/ "$@"
        """))
    wrapper.chmod(0o755)
    return wrapper


def build(tmp, name, compiler, libstdcxx):
    src = tmp / "src"
    if not src.exists():
        src.mkdir()
        (src / "CMakeLists.txt").write_text(PROJECT)
        for f, text in SOURCES.items():
            (src / f).write_text(textwrap.dedent(text))
    out = tmp / name
    args = ["cmake", "-S", str(src), "-B", str(out), f"-DCMAKE_CXX_COMPILER={compiler}",
            "-DCMAKE_BUILD_TYPE=Release"]
    if libstdcxx is not None:
        args.append(f"-DACTCAP_LIBSTDCXX={libstdcxx}")
    conf = subprocess.run(args, capture_output=True, text=True)
    assert conf.returncode == 0, conf.stdout + conf.stderr
    made = subprocess.run(["cmake", "--build", str(out)], capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    return out, conf.stdout


def needed(path):
    dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]


def results(out):
    env = dict(os.environ, LD_LIBRARY_PATH=str(out))
    prog = subprocess.run([str(out / "prog")], capture_output=True, text=True, env=env)
    assert prog.returncode == 0, prog.stderr
    # the module loaded into Python as the package's extension is: after the stand-in, loaded
    # first the way `import torch` loads libtorch (RTLD_LOCAL)
    mod = subprocess.run(["/usr/bin/python3", "-c",
                          "import ctypes, sys; ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_LOCAL); "
                          "m = ctypes.CDLL(sys.argv[1]); "
                          "m.mod_remove_all.restype = ctypes.c_long; print(m.mod_remove_all())",
                          str(out / "libmod.so"), str(out / "libfake.so")],
                         capture_output=True, text=True, env=env)
    assert mod.returncode == 0, mod.stderr
    return int(prog.stdout), int(mod.stdout)


@pytest.mark.parametrize("compiler", ["c++", "static-only"])
def test_libstdcxx_linked_first_beats_a_copy_exported_by_a_library_before_it(tmp_path, compiler):
    cxx = shutil.which("c++") if compiler == "c++" else static_only_compiler(tmp_path)

    # The hazard, shown: without the module both the program and the module call libfake's copy.
    off, _ = build(tmp_path, "off", cxx, "OFF")
    assert results(off) == (FAKE, FAKE)

    # With it: libstdc++ is the first NEEDED library of both, and its remove_all is the one called.
    on, log = build(tmp_path, "on", cxx, None)
    assert "linked first" in log, log
    for f in ("prog", "libmod.so"):
        assert needed(on / f)[0] == "libstdc++.so.6", (f, needed(on / f))
    assert results(on) == (0, 0)
    if compiler == "static-only":
        # found outside the compiler's paths: the system's libstdc++.so.6
        assert "libstdc++.so.6 linked first" in log, log
