"""Static checks of deploy/Dockerfile (scripts/test-containers builds and runs the images)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCKERFILE = Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile"
TARGETS = ("scheduler", "agent", "launcher", "launcher-train", "train")


def stages() -> dict[str, tuple[str, str]]:
    """Each stage's name -> (the image it starts FROM, its instructions)."""
    lines = DOCKERFILE.read_text().splitlines()
    text = "\n".join(line for line in lines if not line.startswith("#")).replace("\\\n", " ")
    found: dict[str, tuple[str, str]] = {}
    parts = re.split(r"^FROM\s+(\S+)\s+AS\s+(\S+)\s*$", text, flags=re.MULTILINE)
    for i in range(1, len(parts), 3):
        found[parts[i + 1]] = (parts[i], parts[i + 2])
    return found


def closure(name: str) -> str:
    """A stage's instructions with those of every stage it starts from or copies from."""
    all_stages = stages()
    seen: set[str] = set()
    todo, text = [name], []
    while todo:
        stage = todo.pop()
        if stage in seen or stage not in all_stages:
            continue
        seen.add(stage)
        parent, body = all_stages[stage]
        text.append(body)
        todo += [parent, *re.findall(r"--from=(\S+)", body)]
    return "\n".join(text)


def test_base_is_a_build_argument_defaulting_to_python_slim() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim-bookworm$", text, flags=re.MULTILINE)
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    assert all(f == "${BASE}" or f in stages() for f in froms), froms


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_runs_as_the_non_root_user(target: str) -> None:
    _, body = stages()[target]
    assert re.search(r"^USER pollux$", body, flags=re.MULTILINE), target


@pytest.mark.parametrize("target", ["scheduler", "agent", "launcher"])
def test_control_plane_images_carry_no_torch(target: str) -> None:
    assert "torch" not in closure(target).replace("import torch", "")


def test_torch_is_pinned_wherever_it_is_installed() -> None:
    text = DOCKERFILE.read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and "torch" in line]
    assert installs
    assert all('"torch==2.13.0"' in line for line in installs), installs
    assert "torch" in closure("train")
    assert "torch" in closure("launcher-train")


def test_the_default_target_is_the_train_image() -> None:
    assert list(stages())[-1] == "train"
