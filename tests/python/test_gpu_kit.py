"""The CPU-side steps of the GPU check kit (scripts/gpu-check.sh), offline: a bundle of the
packages `make gpu-bundle` names, repacked from this machine's installed copies (`make gpu-bundle`
itself downloads them with apt-get), unpacked into a private prefix and configured against
/usr/bin/python3's torch; every dependency must then come from the prefix."""
import os
import re
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path


import actcap_helpers as H

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"


def bundle_packages():
    text = (REPO / "Makefile").read_text()
    m = re.search(r"^GPU_BUNDLE_PACKAGES := ((?:.*\\\n)*.*)$", text, re.M)
    assert m, "GPU_BUNDLE_PACKAGES not found in the Makefile"
    return m.group(1).replace("\\\n", " ").split()


def repack(pkg, out):
    """A .deb of an installed package's files (what `apt-get download` would fetch)."""
    info = subprocess.run(["dpkg-query", "-W", "-f=${Version} ${Architecture}", pkg],
                          capture_output=True, text=True)
    if info.returncode != 0:
        H.skip_or_fail(f"{pkg} is not installed here (make deps installs it)")
    version, arch = info.stdout.split()
    root = out / f"{pkg}-tree"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {pkg}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: actcap tests\n"
        f"Description: repacked {pkg}\n")
    files = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True, check=True)
    for line in files.stdout.splitlines():
        src = Path(line)
        if line in ("/.", "/") or src.is_dir() and not src.is_symlink():
            continue
        if not (src.is_file() or src.is_symlink()):
            continue
        dst = root / line.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(out / f"{pkg}.deb")],
                   check=True, capture_output=True)
    shutil.rmtree(root)


def test_bundle_unpacks_into_a_prefix_and_configures_against_the_given_torch(tmp_path):
    if not shutil.which("dpkg-deb") or not shutil.which("cmake"):
        H.skip_or_fail("dpkg-deb and cmake are needed")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for pkg in bundle_packages():
        repack(pkg, bundle)
    build = tmp_path / "build-gpu"
    env = dict(os.environ, PYTHON="/usr/bin/python3", GPU_BUNDLE=str(bundle), GPU_BUILD=str(build))
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "report"), "unpack", "configure"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    report = (tmp_path / "report" / "report.md").read_text()
    assert run.returncode == 0, report + (tmp_path / "report" / "logs.txt").read_text()[-4000:]
    assert "| unpack | ok |" in report and "| configure | ok |" in report
    assert "torch 1.13" in report
    # what decides the Python package's build there is in the report's head
    assert re.search(r"^- python headers and pybind11: Python\.h found in .*; torch ships no pybind11; "
                     r"pybind11 package \d", report, re.M), report
    assert re.search(r"^- nvcc: ", report, re.M), report
    cache = (build / "CMakeCache.txt").read_text()
    prefix = str(build / "prefix")
    for key in ("nlohmann_json_DIR", "CLI11_DIR", "GTest_DIR", "pkgcfg_lib_XXHASH_xxhash",
                "pkgcfg_lib_PCRE2_pcre2-8", "pkgcfg_lib_ICU_icuuc"):
        m = re.search(rf"^{re.escape(key)}:\w+=(.*)$", cache, re.M)
        assert m and m.group(1).startswith(prefix), (key, m and m.group(1))
    assert re.search(r"^ACTCAP_WERROR:BOOL=OFF$", cache, re.M)
    assert re.search(r"^ACTCAP_MPI:BOOL=OFF$", cache, re.M)
    assert re.search(r"^Python_EXECUTABLE:\w+=/usr/bin/python3$", cache, re.M)
    assert re.search(r"^- pytest: \d", report, re.M), report

    # The bundle's pytest serves a Python that has none (the python stage puts it after the
    # machine's own packages): here the `python3` first on PATH, a separate build.
    other = shutil.which("python3")
    if other and os.path.realpath(other) != "/usr/bin/python3" and subprocess.run(
            [other, "-c", "import pytest"], capture_output=True).returncode != 0:
        site = build / "prefix" / "usr" / "lib" / "python3" / "dist-packages"
        got = subprocess.run([other, "-c", "import pytest; print(pytest.__version__)"],
                             env=dict(os.environ, PYTHONPATH=str(site)), capture_output=True, text=True)
        assert got.returncode == 0, got.stderr[-2000:]

    # A SIGTERM (the device tool's timeout) stops the running stage and still writes the summary.
    proc = subprocess.Popen(["bash", str(SCRIPT), str(tmp_path / "stopped"), "configure", "build"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = build / "logs" / "configure.log"
    log.unlink()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and "-- " in log.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    stopped = (tmp_path / "stopped" / "report.md").read_text()
    assert "| configure | stopped (SIGTERM) |" in stopped, stopped
    assert "Stopped by SIGTERM during stage configure" in stopped and "| build |" not in stopped, stopped

    # Through the CMake shim (what a CUDA pip torch without nvcc gets): the same configure, with
    # Torch_DIR in the build folder and the torch found by the shim.
    shim_env = dict(env, GPU_TORCH_SHIM="1")
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "shim"), "configure"],
                         cwd=REPO, env=shim_env, capture_output=True, text=True, timeout=600)
    shim_report = (tmp_path / "shim" / "report.md").read_text()
    assert run.returncode == 0, shim_report + (tmp_path / "shim" / "logs.txt").read_text()[-4000:]
    cache = (build / "CMakeCache.txt").read_text()
    assert re.search(rf"^Torch_DIR:\w+={re.escape(str(build / 'torch-shim'))}$", cache, re.M), cache[:2000]
    assert "actcap's CMake shim" in (tmp_path / "shim" / "logs.txt").read_text()


def test_missing_bundle_and_unknown_stage_are_clear(tmp_path):
    env = dict(os.environ, PYTHON="/usr/bin/python3", GPU_BUNDLE=str(tmp_path / "none"),
               GPU_BUILD=str(tmp_path / "b"))
    bad = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "r"), "warp"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown stage 'warp'" in bad.stderr
    # every name is checked before any stage runs
    bad = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "r2"), "unpack", "warp"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and not (tmp_path / "r2" / "report.md").exists()
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "r"), "unpack", "configure"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    report = (tmp_path / "r" / "report.md").read_text()
    assert "| unpack | FAILED (exit 1) |" in report and "configure" not in report.split("| ---")[-1]
    assert "run `make gpu-bundle`" in report
    # GPU_CHECK_DEADLINE: a stage that no longer fits is skipped and said so
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "late"), "unpack"], cwd=REPO,
                         env=dict(env, GPU_CHECK_DEADLINE="1"), capture_output=True, text=True, timeout=120)
    late = (tmp_path / "late" / "report.md").read_text()
    assert run.returncode == 1 and "| unpack | skipped (GPU_CHECK_DEADLINE=1 s reached) | 0 |" in late, late


def test_a_crash_in_the_unit_suite_names_the_test_and_brings_its_backtrace(tmp_path):
    """The first GPU run's unit stage said only "exit 139"; a second lease went on finding where.
    Now the stage names the test that was running and runs the suite again under a debugger."""
    if not shutil.which("c++"):
        H.skip_or_fail("c++ is needed")
    build = tmp_path / "build-gpu"
    build.mkdir()
    src = tmp_path / "crash.cpp"
    src.write_text(textwrap.dedent("""\
        #include <cstdio>
        #include <cstdlib>
        volatile int* nowhere = nullptr;
        __attribute__((noinline)) void write_through_null() { *nowhere = 1; }
        int main() {
          std::printf("[ RUN      ] Fake.Passes\\n[       OK ] Fake.Passes (0 ms)\\n");
          std::printf("[ RUN      ] Fake.Crashes\\n");
          std::fflush(stdout);
          // the stage asks for the CUDA tests, as on the GPU
          if (!std::getenv("ACTCAP_REQUIRE_CUDA")) return 3;
          write_through_null();
        }
        """))
    subprocess.run(["c++", "-g", "-O1", str(src), "-o", str(build / "actcap_tests")], check=True)
    env = dict(os.environ, PYTHON="/usr/bin/python3", GPU_BUILD=str(build))
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "r"), "unit"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    report = (tmp_path / "r" / "report.md").read_text()
    assert run.returncode == 1, report
    assert "| unit | FAILED (exit 139) |" in report, report
    assert "killed by signal 11 during Fake.Crashes" in report, report
    if shutil.which("gdb") or shutil.which("cuda-gdb"):
        assert "received signal SIGSEGV" in report and "write_through_null" in report, report
    else:
        assert "(no cuda-gdb or gdb for a backtrace)" in report, report


def test_the_transformers_stage_without_transformers_5_says_not_run(tmp_path):
    """Its tests are written for transformers 5 and skip under 4.x: pytest would pass having run
    nothing. The stage reports "not run" with the version instead, neither passed nor failed."""
    fake = tmp_path / "site" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "4.57.1"\n')
    env = dict(os.environ, PYTHON="/usr/bin/python3", GPU_BUILD=str(tmp_path / "build-gpu"),
               PYTHONPATH=str(tmp_path / "site"))
    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "r"), "transformers"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    report = (tmp_path / "r" / "report.md").read_text()
    assert run.returncode == 0, report
    assert ("| transformers | not run: no transformers >= 5 for /usr/bin/python3 (4.57.1): the "
            "tests are written for 5.x |") in report, report
    assert "Not run: transformers" in report and "All stages that ran passed." in report, report
    assert "Failed:" not in report, report
