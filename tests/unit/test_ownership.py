"""Rendezvous ownership: deterministic, balanced, and minimal movement when agents change."""

from __future__ import annotations

import ast
import collections
from dataclasses import dataclass
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pollux.service.ownership import owner, ranked, weight

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
agent_sets = st.sets(ids, min_size=1, max_size=8)
job_lists = st.lists(ids, min_size=1, max_size=40)


def test_weights_are_pinned_so_every_process_and_release_agrees():
    # The launcher and every agent must compute the same owner in any Python process: the
    # weights come from BLAKE2b, not the per-process salted hash(). Changing these values is a
    # protocol change (agents and launchers of different versions would disagree on owners).
    assert weight("j-1", "agent-a") == 5835943724940108843
    assert ranked("j-1", ["agent-a", "agent-b", "agent-c"]) == ["agent-b", "agent-c", "agent-a"]
    assert owner("j-1", ["agent-a", "agent-b", "agent-c"]) == "agent-b"


def test_no_agents_means_no_owner():
    assert owner("j-1", []) is None
    assert ranked("j-1", []) == []


@given(job=ids, agents=agent_sets)
def test_owner_does_not_depend_on_the_order_agents_are_listed(job, agents):
    forward = sorted(agents)
    assert owner(job, forward) == owner(job, reversed(forward))
    assert ranked(job, forward) == ranked(job, list(reversed(forward)))


@given(job=ids, agents=agent_sets)
def test_ranked_starts_with_the_owner_and_keeps_every_agent(job, agents):
    order = ranked(job, agents)
    assert order[0] == owner(job, agents)
    assert sorted(order) == sorted(agents)


@given(jobs=job_lists, agents=agent_sets.filter(lambda a: len(a) >= 2), data=st.data())
def test_removing_an_agent_moves_only_its_jobs(jobs, agents, data):
    gone = data.draw(st.sampled_from(sorted(agents)))
    rest = agents - {gone}
    for job in jobs:
        before = owner(job, agents)
        after = owner(job, rest)
        if before != gone:
            assert after == before
        else:
            assert after in rest


@given(jobs=job_lists, agents=agent_sets, new=ids)
def test_adding_an_agent_moves_jobs_only_to_it(jobs, agents, new):
    for job in jobs:
        after = owner(job, agents | {new})
        assert after in (owner(job, agents), new)


def test_jobs_spread_evenly_over_agents():
    agents = [f"agent-{i}" for i in range(10)]
    counts = collections.Counter(owner(f"j-{n:05d}", agents) for n in range(10_000))
    assert set(counts) == set(agents)
    assert min(counts.values()) > 800
    assert max(counts.values()) < 1200


def test_ranked_accepts_registrations_with_a_key():
    @dataclass(frozen=True)
    class Member:
        id: str
        address: str

    members = [Member(f"agent-{i}", f"10.0.0.{i}:7000") for i in range(4)]
    order = ranked("j-7", members, key=lambda m: m.id)
    assert [m.id for m in order] == ranked("j-7", [m.id for m in members])


def test_module_imports_only_the_standard_library():
    # The launcher imports it to order POLLUX_AGENT_ADDR; it must not pull grpc or etcd.
    source = (
        Path(__file__).resolve().parents[2]
        / "services"
        / "common"
        / "pollux"
        / "service"
        / "ownership.py"
    )
    tree = ast.parse(source.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= {"__future__", "hashlib", "collections", "typing"}
