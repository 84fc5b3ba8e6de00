"""scripts/torch2-check.sh's usage, offline (its stages need root, debootstrap and deb.debian.org:
DEVELOPERS.md "LibTorch 2.x without a GPU"). A bad call is refused before anything is made."""
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "torch2-check.sh"


def run(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env={"PATH": "/usr/bin:/bin", **env}, timeout=60)


def test_without_a_report_folder_it_prints_its_usage():
    r = run()
    assert r.returncode == 2 and "usage: scripts/torch2-check.sh REPORT_DIR" in r.stderr


def test_an_unknown_stage_is_refused_before_any_root_is_made(tmp_path):
    root = tmp_path / "root"
    r = run(tmp_path / "report", "root", "bild", TORCH2_ROOT=str(root))
    assert r.returncode == 2
    assert "unknown stage 'bild' (stages: root build unit python)" in r.stderr
    assert not root.exists()
    assert not (tmp_path / "report" / "report.md").exists()
