"""Fixtures for the actcap Python tests.

The binary is $ACTCAP (default <repo>/build/actcap). If $ACTCAP is set but missing, tests that need
the binary fail; if it is unset and the default build is missing, they are skipped (the reference
self-tests in test_reference.py still run) -- except under CI (CI=true), where they fail.
"""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import actcap_helpers as H  # noqa: E402


@pytest.fixture(scope="session")
def actcap_bin():
    path = H.binary_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        if os.environ.get("ACTCAP"):
            pytest.fail(f"$ACTCAP={path} is not an executable file")
        H.skip_or_fail(f"actcap binary not built ({path}); set $ACTCAP")
    return path


@pytest.fixture
def no_reexec(monkeypatch):
    """actcap re-executes itself once to set OMP_WAIT_POLICY=passive unless it is set: set it
    (the same setting, half the start-up time; values do not depend on it). For test files that
    start actcap many times: pytestmark = pytest.mark.usefixtures("no_reexec")."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")


@pytest.fixture(scope="session")
def models(actcap_bin, tmp_path_factory):
    """models(arch, dtype=None, tie=None, seed=0) -> Path of a cached `actcap init-model` tiny
    checkpoint. Treat it as read-only: copy it (H.copy_model) before rewriting it."""
    root = tmp_path_factory.mktemp("models")
    cache = {}

    def get(arch, dtype=None, tie=None, seed=0, preset="tiny"):
        if tie is not None:
            # reuse the default checkpoint when --tie-word-embeddings asks for the arch default
            plain = get(arch, dtype=dtype, seed=seed, preset=preset)
            cfg = H.load_config(plain)
            default_tie = cfg.get("tie_word_embeddings", arch == "gpt2")
            if default_tie == tie:
                return plain
        key = (arch, dtype, tie, seed, preset)
        if key not in cache:
            name = "-".join(str(k) for k in key)
            cache[key] = H.init_model(root / name, arch, preset=preset, seed=seed, dtype=dtype, tie=tie)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def ac():
    """The actcap Python package as `make build` assembles it (<build>/python, next to $ACTCAP)."""
    pkg = H.python_package_dir()
    if not list(pkg.glob("actcap/_core*.so")):
        H.skip_or_fail(f"the Python package is not built ({pkg}/actcap); run make build")
    if str(pkg) not in sys.path:
        sys.path.insert(0, str(pkg))
    import actcap

    assert Path(actcap.__file__).resolve().parent == (pkg / "actcap").resolve(), actcap.__file__
    return actcap


@pytest.fixture(scope="session")
def gpt2_ckpt(models):
    """A tiny GPT-2 checkpoint (actcap init-model) with 4 blocks."""
    return models("gpt2")
