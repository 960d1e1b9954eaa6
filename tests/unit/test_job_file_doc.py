"""docs/job-file.md documents exactly the keys the job-spec contract knows, as the table says.

Every key of `pollux.jobspec.FIELDS` has a row in the page's table (type, default and the
numbers of its bounds as the contract has them) and a section of its own; no other key is
documented; every YAML example in the page is a value the client accepts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pollux import jobspec
from pollux.client.types import JobSpec
from pollux.jobspec import Kind

PAGE = Path(__file__).resolve().parents[2] / "docs" / "job-file.md"
TEXT = PAGE.read_text(encoding="utf-8")
ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", re.MULTILINE)
SECTION = re.compile(r"^### `([^`]+)`$", re.MULTILINE)
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```$", re.MULTILINE | re.DOTALL)

ROWS = {m.group(1): [cell.strip() for cell in m.groups()[1:]] for m in ROW.finditer(TEXT)}


def test_every_key_has_one_row_and_one_section_and_nothing_else_is_documented() -> None:
    sections = SECTION.findall(TEXT)
    assert sorted(sections) == sorted(jobspec.KEYS), "sections"
    assert len(sections) == len(set(sections))
    assert sorted(ROWS) == sorted(jobspec.KEYS), "table rows"
    assert len(ROW.findall(TEXT)) == len(jobspec.KEYS)


@pytest.mark.parametrize("spec_field", jobspec.FIELDS, ids=lambda f: f.key)
def test_each_row_says_what_the_contract_says(spec_field: jobspec.Field) -> None:
    kind, default, bounds, flag = ROWS[spec_field.key]
    assert kind.startswith(spec_field.kind.value)
    if spec_field.kind is Kind.CHOICE:
        assert re.findall(r"`([a-z]+)`", kind) == list(spec_field.choices)
    assert default == ("required" if spec_field.required else spec_field.default)
    numbers = {int(n) for n in re.findall(r"\d+", bounds)}
    for limit in (spec_field.most, spec_field.max_entries, spec_field.max_chars):
        assert not limit or limit in numbers, (limit, bounds)
    if spec_field.kind is Kind.COUNT:
        assert spec_field.least in numbers
    dashes = "--" + spec_field.key.replace("_", "-")
    assert flag.startswith(f"`{dashes}") or spec_field.kind in (Kind.ARGV, Kind.NAMES, Kind.MOUNTS)


def test_the_page_states_the_limits_across_keys() -> None:
    assert str(jobspec.MAX_SPEC_BYTES) in TEXT
    assert str(jobspec.MAX_ENV) in ROWS["env"][2]
    assert str(jobspec.MAX_PATH) in TEXT


@pytest.mark.parametrize("block", YAML_BLOCK.findall(TEXT))
def test_every_yaml_example_is_a_valid_spec(block: str) -> None:
    example = yaml.safe_load(block)
    base = {"name": "example-job", "command": ["python", "train.py"], "initial_batch_size": 64}
    if any(key in example for key in ("shm_size_mb", "mounts")):
        base["image"] = "ubuntu"
    JobSpec.from_mapping({**base, **example})
