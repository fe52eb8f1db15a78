import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_missing_command_module_is_an_error_not_a_missing_command() -> None:
    from corral.cli._main import COMMANDS, Command, build_parser

    parser = build_parser({**COMMANDS, "nope": Command("corral.cli._no_such_cmd:x", "gone")})
    with pytest.raises(ModuleNotFoundError, match="corral.cli._no_such_cmd"):
        parser.parse_args(["nope"])


def test_python_m_corral_server_does_not_load_the_cli() -> None:
    code = ("import sys, runpy\nsys.argv = ['x', '--help']\n"
            "try:\n    runpy.run_module('corral.server', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('corral.cli')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(corral.__file__).parent.parent)})
    assert out.returncode == 0, out.stderr
    assert "usage: corral serve" in out.stdout and "--reap-interval" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"
