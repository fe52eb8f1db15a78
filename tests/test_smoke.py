import subprocess
import sys

import corral


def test_version_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "corral", "--version"], capture_output=True, text=True, check=True
    )
    assert corral.__version__ in out.stdout


def test_no_command_is_a_clear_usage_error() -> None:
    out = subprocess.run([sys.executable, "-m", "corral"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
