"""pollux-cli's contexts (pollux.client.config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pollux.client.config import ConfigFileError, Context, resolve, write_context


def env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"POLLUX_CONFIG": str(tmp_path / "config.toml"), **more}


def test_a_written_context_is_current_and_private(tmp_path: Path):
    path = tmp_path / "config.toml"
    write_context(path, "local", Context("127.0.0.1:7070", tmp_path / "ca.pem", "pollux_t"))
    assert path.stat().st_mode & 0o777 == 0o600, "it holds a token"
    got = resolve(env(tmp_path))
    assert got == Context("127.0.0.1:7070", tmp_path / "ca.pem", "pollux_t")


def test_contexts_are_kept_and_chosen_by_flag_or_environment(tmp_path: Path):
    path = tmp_path / "config.toml"
    write_context(path, "a", Context("a:1", None, "ta"))
    write_context(path, "b", Context("b:2", None, "tb"))
    assert resolve(env(tmp_path)).server == "b:2", "the last written is current"
    assert resolve(env(tmp_path), context="a").token == "ta"
    assert resolve(env(tmp_path, POLLUX_CONTEXT="a")).server == "a:1"


def test_flags_and_environment_override_the_context(tmp_path: Path):
    write_context(tmp_path / "config.toml", "a", Context("a:1", tmp_path / "ca.pem", "ta"))
    got = resolve(
        env(tmp_path, POLLUX_SERVER="e:3", POLLUX_TOKEN="te", POLLUX_CA="/x.pem"), server="f:4"
    )
    assert got == Context("f:4", Path("/x.pem"), "te")


def test_unknown_contexts_and_broken_files_say_what_to_do(tmp_path: Path):
    write_context(tmp_path / "config.toml", "a", Context("a:1"))
    with pytest.raises(ConfigFileError, match=r"no context 'zz' .*\(known: a\)"):
        resolve(env(tmp_path), context="zz")
    (tmp_path / "config.toml").write_text("not = [toml")
    with pytest.raises(ConfigFileError, match="cannot read"):
        resolve(env(tmp_path))
