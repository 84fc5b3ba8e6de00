"""`pip install --no-build-isolation .` into a fresh virtual environment that sees the system torch:
the installed package imports from outside the repository and captures, saves and verifies.

To stay inside CI's time, pip reuses the `make build` folder (ACTCAP_BUILD_DIR, next to $ACTCAP):
setup.py's CMake build step then only relinks the extension there. The from-scratch path (no
ACTCAP_BUILD_DIR: setup.py configures and builds its own CMake folder) is the same code after the
configure step; docs/python.md gives its command and time."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import actcap_helpers as H

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys, torch, actcap
    assert "site-packages" in actcap.__file__, actcap.__file__
    assert not any(p.endswith("build/python") for p in sys.path)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 5, 4)
    with torch.no_grad(), actcap.SafeCapturer(model, "*", positions="last") as cap:
        y = model(x)
    assert torch.equal(cap.get("2"), y[:, -1])
    cap.save(sys.argv[1])
    try:
        actcap.SafeCapturer(model, "3")
    except actcap.InputError as e:
        print("InputError:", e)
    print("rows", actcap.open(sys.argv[1]).rows)
""")


def unmet_torch_requirements():
    """What torch's own installed dependencies ask for and the installed packages do not give (pip
    checks it when it installs anything that needs torch, and offline cannot fix it): e.g. Debian
    trixie's sympy pinned to a version trixie does not ship, sid's sympy 1.14 asking for
    mpmath<1.4 beside python3-mpmath 1.4.1."""
    import importlib.metadata as md
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    seen, unmet = set(), []

    def walk(name):
        key = name.lower().replace("_", "-")
        if key in seen:
            return
        seen.add(key)
        dist = md.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = md.version(req.name)
            except md.PackageNotFoundError:
                unmet.append(f"{dist.metadata['Name']} {dist.version} needs {req}: not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{dist.metadata['Name']} {dist.version} needs {req}: {have} installed")
            walk(req.name)

    walk("torch")
    return unmet


def test_pip_install_into_a_fresh_venv(ac, actcap_bin, tmp_path):
    build_dir = Path(actcap_bin).resolve().parent
    if not (build_dir / "CMakeCache.txt").exists():
        H.skip_or_fail(f"{build_dir} is not a CMake build folder")
    unmet = unmet_torch_requirements()
    if unmet:
        H.skip_or_fail("this system's torch has unmet dependencies of its own, which an offline pip "
                       "cannot resolve for any package that needs torch: " + "; ".join(unmet))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = dict(os.environ, ACTCAP_BUILD_DIR=str(build_dir), PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    pip = subprocess.run([str(py), "-m", "pip", "install", "--no-build-isolation", "--no-index",
                          str(REPO)], capture_output=True, text=True, env=env,
                         timeout=900)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    out = tmp_path / "out"
    run = subprocess.run([str(py), "-c", SCRIPT, str(out)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "InputError: point pattern '3' matches no module" in run.stdout
    assert "rows 3" in run.stdout
    assert H.actcap("verify", out).returncode == 0
