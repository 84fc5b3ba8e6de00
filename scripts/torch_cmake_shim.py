#!/usr/bin/env python3
"""Writes a minimal CMake package for the LibTorch inside a Python torch: OUT_DIR/TorchConfig.cmake
and TorchConfigVersion.cmake, for `-DTorch_DIR=OUT_DIR`.

Why: a CUDA pip torch's own TorchConfig.cmake (through Caffe2's public/cuda.cmake) insists on a CUDA
toolkit (nvcc, the toolkit's headers) and stops configuring without one, though actcap includes no
CUDA header: it reaches CUDA only through c10's device-generic API, whose code lives in
libtorch_cuda / libc10_cuda. A pip torch ships those libraries, not nvcc. scripts/gpu-check.sh uses
this package where no nvcc is found, or where configuring with torch's own package failed.

What it defines, as torch's own package does for a consumer: Torch_FOUND, Torch_VERSION, the
imported target `torch` (include dirs, the C++ ABI define, the libraries; libtorch_cuda and
libc10_cuda linked with --no-as-needed so that their CUDA backend registers even where the linker
defaults to --as-needed), TORCH_LIBRARIES, TORCH_INCLUDE_DIRS, TORCH_INSTALL_PREFIX, TORCH_CXX_FLAGS.

usage: torch_cmake_shim.py OUT_DIR      (run with the Python whose torch to build against)
"""
import os
import sys


def cmake_list(items):
    return ";".join(str(i).replace(";", r"\;") for i in items)


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    out = os.path.abspath(argv[1])
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is the same answer
        print(f"torch_cmake_shim: {sys.executable} cannot import torch ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 1
    root = os.path.dirname(torch.__file__)
    inc = [os.path.join(root, "include"), os.path.join(root, "include", "torch", "csrc", "api", "include")]
    lib = os.path.join(root, "lib")
    missing = [p for p in inc if not os.path.isdir(p)]
    if missing:
        print(f"torch_cmake_shim: torch at {root} has no C++ headers ({missing[0]} missing)",
              file=sys.stderr)
        return 1

    def so(name):
        p = os.path.join(lib, f"lib{name}.so")
        return p if os.path.exists(p) else None

    core = [so(n) for n in ("torch", "torch_cpu", "c10")]
    if None in core:
        print(f"torch_cmake_shim: {lib} lacks libtorch.so, libtorch_cpu.so or libc10.so", file=sys.stderr)
        return 1
    accel = [p for p in (so("torch_cuda"), so("c10_cuda")) if p]
    link = list(core) + [f"-Wl,--no-as-needed,{p},--as-needed" for p in accel]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    version = torch.__version__.split("+")[0]

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "TorchConfigVersion.cmake"), "w") as f:
        f.write(f'set(PACKAGE_VERSION "{version}")\n'
                'if(PACKAGE_FIND_VERSION AND PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION)\n'
                '  set(PACKAGE_VERSION_COMPATIBLE FALSE)\nelse()\n'
                '  set(PACKAGE_VERSION_COMPATIBLE TRUE)\n'
                '  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)\n'
                '    set(PACKAGE_VERSION_EXACT TRUE)\n  endif()\nendif()\n')
    with open(os.path.join(out, "TorchConfig.cmake"), "w") as f:
        f.write(f"""# Written by actcap's scripts/torch_cmake_shim.py for the torch at {root}
# (torch {torch.__version__}, CUDA {torch.version.cuda}); see that script for why.
if(NOT TARGET torch)
  add_library(torch INTERFACE IMPORTED)
  set_target_properties(torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "{cmake_list(inc)}"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI={abi}"
    INTERFACE_LINK_LIBRARIES "{cmake_list(link)}")
endif()
set(Torch_FOUND TRUE)
set(Torch_VERSION "{version}")
set(TORCH_INSTALL_PREFIX "{root}")
set(TORCH_INCLUDE_DIRS "{cmake_list(inc)}")
set(TORCH_LIBRARIES torch)
set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI={abi}")
set(ACTCAP_TORCH_SHIM TRUE)
message(STATUS "Torch {version} from {root} (actcap's CMake shim: no CUDA toolkit needed; "
               "accelerator libraries: {', '.join(os.path.basename(p) for p in accel) or 'none'})")
""")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
