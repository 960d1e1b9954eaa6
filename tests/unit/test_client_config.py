"""pollux-cli's contexts (pollux.client.config)."""

from __future__ import annotations

import multiprocessing
import tomllib
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


def _write_many(path: str, writer: int, count: int) -> None:
    """One writer process: `count` contexts of its own, none of them made current."""
    for i in range(count):
        write_context(Path(path), f"w{writer}-{i}", Context(f"h{writer}:{i + 1}"), current=None)


def test_concurrent_writers_keep_every_context_and_the_first_current(tmp_path: Path) -> None:
    """Processes writing at once (two pollux-up): none loses another's context.

    Each read-modify-write runs under the config's lock, so the file ends with every context
    written; `current=None` decides under the lock, so the first context written stays the
    current one whoever writes after it.
    """
    path = tmp_path / "config.toml"
    write_context(path, "first", Context("first:1"), current=None)
    ctx = multiprocessing.get_context("fork")
    writers, count = 6, 15
    procs = [ctx.Process(target=_write_many, args=(str(path), w, count)) for w in range(writers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    data = tomllib.loads(path.read_text())
    expected = {"first"} | {f"w{w}-{i}" for w in range(writers) for i in range(count)}
    assert set(data["contexts"]) == expected
    assert data["current_context"] == "first"
    assert path.stat().st_mode & 0o777 == 0o600
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "temp files left"


def test_pollux_up_becomes_current_only_where_no_other_context_is(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert write_context(path, "local", Context("a:1"), current=None) is True
    assert write_context(path, "local", Context("a:2"), current=None) is True
    assert write_context(path, "other", Context("b:1"), current=None) is False
    assert resolve(env(tmp_path)).server == "a:2"
    assert write_context(path, "other", Context("b:1")) is True  # an explicit current=True
