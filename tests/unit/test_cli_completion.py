"""`pollux-cli completion bash|zsh`: scripts generated from the parser, run in the real shells.

The bash script is sourced by a real bash that then calls its completion function the way
bash's programmable completion does (COMP_WORDS / COMP_CWORD in, COMPREPLY out). zsh
completion functions only run inside the completion system, so the zsh script is checked for
syntax and its function is called with the completion system's variables set and its
builtins (`_describe`, `_files`) replaced by stand-ins that print what they were given.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pollux.client import cli
from pollux.client.types import JOB_STATES, SCALING_RULES

BASH = shutil.which("bash")
ZSH = shutil.which("zsh")


def completion_script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    def no_server(args: argparse.Namespace) -> None:
        raise AssertionError("completion needs no scheduler")

    assert cli.main(["completion", shell], connect=no_server) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert out.endswith("\n")
    return out


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "pollux-cli.bash"
    path.write_text(cli.completion.script(cli.build_parser({}), "bash", cli._COMPLETION_HINTS))
    return path


def bash_complete(script: Path, *words: str, cwd: Path | None = None) -> set[str]:
    """What bash completes for `pollux-cli WORDS...`, the last word being the cursor's."""
    assert BASH is not None
    program = (
        'source "$1"; shift; COMP_WORDS=(pollux-cli "$@"); COMP_CWORD=$#; _pollux_cli; '
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", program, "bash", str(script), *words],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=True,
    )
    assert done.stderr == ""
    return {line for line in done.stdout.splitlines() if line}


TOP = {  # the commands a person may type (hidden ones, like __jobs, are not offered)
    name
    for name in cli.build_parser({})._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    if not name.startswith("__")
}


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize(
    ("words", "want"),
    [
        (("l",), {"ls", "logs"}),
        (("",), TOP),
        (("-o", ""), {"table", "json", "yaml"}),
        (("ls", "--output", "=", "y"), {"yaml"}),  # bash splits --output=y at "="
        (("ls", "--output", "="), {"table", "json", "yaml"}),
        (("ls", "--st"), {"--state"}),
        (("ls", "--state", ""), set(JOB_STATES)),
        (("ls", "--state", "RU"), {"RUNNING"}),
        (("--server", "h:1", "d"), {"describe", "delete", "dashboard"}),
        (("submit", "--scaling-rule", ""), set(SCALING_RULES)),
        (("submit", "--ini"), {"--initial-batch-size"}),
        (("submit", "--batch-size", "32", "--na"), {"--name"}),
        (("admin", ""), {"token", "tenant", "audit"}),
        (("admin", "token", ""), {"create", "revoke", "ls"}),
        (("admin", "token", "create", "--role", ""), {"user", "admin"}),
        (("completion", ""), {"bash", "zsh"}),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else None,
)
def test_bash_completes_commands_flags_and_choices(
    bash_script: Path, words: tuple[str, ...], want: set[str]
) -> None:
    assert bash_complete(bash_script, *words) == want


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_bash_offers_every_visible_flag_and_no_hidden_one(bash_script: Path) -> None:
    flags = bash_complete(bash_script, "submit", "-")
    assert {"--file", "-f", "--initial-batch-size", "--working-dir", "--output", "--help"} <= flags
    assert not {"--batch-size", "--workdir", "--stop-grace", "--shm-size"} & flags


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_bash_completes_paths_where_a_path_goes(bash_script: Path, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: a\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "train.py").write_text("")
    assert bash_complete(bash_script, "submit", "-f", f"{tmp_path}/jo") == {
        f"{tmp_path}/job.yaml",
        f"{tmp_path}/jobs",
    }
    assert bash_complete(bash_script, "submit", "--working-dir", f"{tmp_path}/jo") == {
        f"{tmp_path}/jobs"
    }
    # After --, the replica's command line: file names (in the current directory).
    assert bash_complete(bash_script, "submit", "--", "python", "tr", cwd=tmp_path) == {"train.py"}
    # In `logs`, -f is --follow, a switch: what follows is not a file name.
    assert "--rank" in bash_complete(bash_script, "logs", "-f", "-")


def test_the_cli_prints_both_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    bash = completion_script("bash", capsys)
    assert "complete -F _pollux_cli pollux-cli" in bash
    zsh = completion_script("zsh", capsys)
    assert zsh.startswith("#compdef pollux-cli\n")
    assert cli.main(["completion", "fish"]) == cli.EXIT_USAGE
    assert "invalid choice: 'fish'" in capsys.readouterr().err


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_bash_script_syntax(bash_script: Path) -> None:
    assert BASH is not None
    subprocess.run([BASH, "-n", str(bash_script)], check=True, timeout=60)


# ---- zsh -------------------------------------------------------------------------------------

needs_zsh = pytest.mark.skipif(ZSH is None, reason="zsh is not installed (scripts/test adds it)")


@pytest.fixture(scope="module")
def zsh_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "_pollux-cli"
    path.write_text(cli.completion.script(cli.build_parser({}), "zsh", cli._COMPLETION_HINTS))
    return path


# Stand-ins for the completion system's functions: print what the widget hands them.
ZSH_HARNESS = """\
source "$1"; shift
_describe() { print -r -- "IPREFIX=$IPREFIX PREFIX=$PREFIX"; print -rl -- "${(@P)${@[-1]}}"; }
_files() { print -r -- "_files $*"; }
words=(pollux-cli "$@"); CURRENT=${#words}; PREFIX=${words[CURRENT]}; IPREFIX=
_pollux_cli
"""


def zsh_complete(script: Path, *words: str) -> list[str]:
    assert ZSH is not None
    done = subprocess.run(
        [ZSH, "-f", "-c", ZSH_HARNESS, "zsh", str(script), *words],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stderr == ""
    return done.stdout.splitlines()


@needs_zsh
def test_zsh_script_syntax(zsh_script: Path) -> None:
    assert ZSH is not None
    subprocess.run([ZSH, "-n", str(zsh_script)], check=True, timeout=60)


@needs_zsh
def test_zsh_describes_commands_with_their_help(zsh_script: Path) -> None:
    lines = zsh_complete(zsh_script, "l")
    assert lines[0] == "IPREFIX= PREFIX=l"
    assert "ls:list jobs, active first, newest first" in lines
    assert {line.split(":", 1)[0] for line in lines[1:]} == TOP


@needs_zsh
def test_zsh_completes_a_flag_value_after_the_equals_sign(zsh_script: Path) -> None:
    assert zsh_complete(zsh_script, "ls", "--output=j") == [
        "IPREFIX=--output= PREFIX=j",
        "table",
        "json",
        "yaml",
    ]
    assert zsh_complete(zsh_script, "ls", "--state", "")[1:] == list(JOB_STATES)


@needs_zsh
def test_zsh_completes_files_for_a_job_file(zsh_script: Path) -> None:
    assert zsh_complete(zsh_script, "submit", "--file", "jo") == ["_files "]
    assert zsh_complete(zsh_script, "submit", "--working-dir", "") == ["_files -/"]


# An interactive zsh on a pseudo-terminal (zsh's own zpty module), with the script installed
# as an fpath function and the completion system loaded: the keys typed, tabs included, are
# handled in order, and the command line is then printed; reading waits for that line.
ZSH_INTERACTIVE = """\
zmodload zsh/zpty || exit 3
zpty z 'zsh -f -i'
zpty -w z "PS1='> '; fpath=($1 \\$fpath); pollux-cli() { :; }"
zpty -w z 'autoload -Uz compinit; compinit -u -D'
zpty -w -n z "$2"$'\\C-a print -r -- $((6*7))RES: \\n'
zpty -r z out '*42RES:*'$'\\n'
zpty -d z
print -r -- "${${out##*42RES: }%%$'\\r'*}"
"""


@needs_zsh
@pytest.mark.parametrize(
    ("typed", "want"),
    [
        ("pollux-cli ls --output=j\t --sta\t RU\t", "pollux-cli ls --output=json --state RUNNING"),
        ("pollux-cli ad\t to\tcr\t--ro\t a\t", "pollux-cli admin token create --role admin"),
        ("pollux-cli submit --initial-b\t", "pollux-cli submit --initial-batch-size"),
    ],
)
def test_zsh_completes_in_a_real_interactive_shell(zsh_script: Path, typed: str, want: str) -> None:
    assert ZSH is not None
    done = subprocess.run(
        [ZSH, "-f", "-c", ZSH_INTERACTIVE, "zsh", str(zsh_script.parent), typed],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.rstrip() == want


@needs_zsh
def test_zsh_offers_flags_but_not_hidden_ones(zsh_script: Path) -> None:
    names = {line.split(":", 1)[0] for line in zsh_complete(zsh_script, "submit", "--")[1:]}
    assert "--initial-batch-size" in names
    assert "--batch-size" not in names


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_bash_completes_job_names_and_ids_from_the_scheduler(bash_script, tmp_path, monkeypatch):
    # A stand-in pollux-cli first on PATH answers the hidden command as the real one would.
    fake = tmp_path / "bin" / "pollux-cli"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\n[ "$3" = __jobs ] && printf "%s\\n" resnet-a resnet-b j-0123456789\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    assert bash_complete(bash_script, "describe", "res") == {"resnet-a", "resnet-b"}
    assert bash_complete(bash_script, "logs", "-f", "j-") == {"j-0123456789"}
    assert bash_complete(bash_script, "cancel", "") == {"resnet-a", "resnet-b", "j-0123456789"}
    # A flag still completes as a flag; a command without a job argument offers no jobs.
    assert "--rank" in bash_complete(bash_script, "logs", "--r")
    assert "resnet-a" not in bash_complete(bash_script, "nodes", "")


def test_the_hidden_jobs_command_prints_names_then_ids(capsys):
    from tests.unit.test_cli_args import FakeClient

    fake = FakeClient()
    assert cli.main(["__jobs"], connect=lambda args: fake) == 0  # type: ignore[arg-type,return-value]
    words = capsys.readouterr().out.split()
    assert words
    assert fake.calls[0][0] == "list_jobs"
    assert all(w.startswith("j-") for w in words[len(words) // 2 :])
