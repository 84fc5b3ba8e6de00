"""Fixtures for the actcap CLI integration tests (bad input -> exit 2 with one clean error line)."""
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import actcap_helpers as H  # noqa: E402


@pytest.fixture(scope="session")
def actcap_bin():
    path = H.binary_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        if os.environ.get("ACTCAP"):
            pytest.fail(f"$ACTCAP={path} is not an executable file")
        H.skip_or_fail(f"actcap binary not built ({path}); set $ACTCAP")
    return path


@pytest.fixture(scope="session")
def tiny_gpt2(actcap_bin, tmp_path_factory):
    """A valid `actcap init-model --arch gpt2 --preset tiny` checkpoint (read-only)."""
    return H.init_model(tmp_path_factory.mktemp("valid") / "gpt2", "gpt2", seed=0)


@pytest.fixture
def model(tiny_gpt2, tmp_path):
    """A private copy of the tiny GPT-2 checkpoint that the test may break."""
    dst = tmp_path / "model"
    shutil.copytree(tiny_gpt2, dst)
    return dst
