"""``corral acp`` brings a prompt's file edits into the editor's files, driven by the
official ACP client library (tests/server/acp/acp_session.mjs): through the editor's
``fs/write_text_file`` when it advertises it, else into its directory directly; a file the
user changed meanwhile is kept and named; a symlink in the user's tree or the sandbox is
never followed or copied."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.server.conftest import Home
from tests.server.test_acp_agent import Editor, acp_client, editors  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(240)


def corral_acp() -> list[str]:
    return [sys.executable, "-m", "corral", "acp", "--harness", "command"]


def test_edits_reach_the_editor_through_fs_write_text_file(
        home: Home, acp_client: Path, tmp_path: Path,  # noqa: F811
        editors: list[Editor]) -> None:  # noqa: F811
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("from the project\n")
    (project / "keep.txt").write_text("to go\n")
    editor = Editor(acp_client, {
        "cmd": corral_acp(), "env": home.env, "cwd": str(project), "fsWrite": True,
        "prompt": "printf 'edited by the agent\\n' > notes.txt; mkdir -p sub; "
                  "printf 'new\\n' > sub/new.txt; rm keep.txt; echo done"})
    editors.append(editor)
    editor.wait()
    assert [s["stopReason"] for s in editor.kinds("stop")] == ["end_turn"]
    writes = {w["path"]: w["content"] for w in editor.kinds("write")}
    assert writes == {str(project / "notes.txt"): "edited by the agent\n",
                      str(project / "sub" / "new.txt"): "new\n"}
    # the editor saved what it was given; the deletion (no ACP method) was corral's
    assert (project / "notes.txt").read_text() == "edited by the agent\n"
    assert (project / "sub" / "new.txt").read_text() == "new\n"
    assert not (project / "keep.txt").exists()
    assert "not brought into your files" not in editor.text()


def test_edits_reach_the_directory_and_the_users_own_edits_and_symlinks_win(
        home: Home, acp_client: Path, tmp_path: Path,  # noqa: F811
        editors: list[Editor]) -> None:  # noqa: F811
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("from the project\n")
    (project / "other.txt").write_text("zero\n")
    (project / "run.sh").write_text("#!/bin/sh\n")
    (project / "run.sh").chmod(0o755)
    outside = tmp_path / "outside"
    outside.mkdir()
    # between the turns the user edits notes.txt and puts a symlink to outside their
    # project where the agent then makes a directory
    editor = Editor(acp_client, {
        "cmd": corral_acp(), "env": home.env, "cwd": str(project),
        "prompt": "printf 'one\\n' > other.txt; printf '#!/bin/sh\\necho hi\\n' > run.sh",
        "beforeThen": [{"path": str(project / "notes.txt"), "content": "the user's edit\n"},
                       {"path": str(project / "out"), "symlink": str(outside)}],
        "then": "printf 'agent\\n' > notes.txt; printf 'two\\n' > other.txt; "
                "mkdir -p out; echo pwned > out/x; ln -s /etc/passwd link; echo done"})
    editors.append(editor)
    editor.wait()
    assert [s["stopReason"] for s in editor.kinds("stop")] == ["end_turn", "end_turn"]
    assert editor.kinds("write") == []  # the editor offers no fs: corral wrote the files
    assert (project / "other.txt").read_text() == "two\n"
    assert (project / "run.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert (project / "run.sh").stat().st_mode & 0o777 == 0o755  # its mode kept
    assert (project / "notes.txt").read_text() == "the user's edit\n"  # kept
    assert not (outside / "x").exists() and (project / "out").is_symlink()
    assert not (project / "link").exists() and not (project / "link").is_symlink()
    said = editor.text()
    assert "notes.txt: changed in your editor" in said, said
    assert "out/x: out is not a directory in your files" in said, said
    assert "link: a symlink in the sandbox" in said, said
