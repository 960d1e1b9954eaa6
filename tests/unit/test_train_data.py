"""The adaptive loader: step plans, exactly-once epochs across restarts, iterable datasets."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch.utils.data import Dataset, IterableDataset  # noqa: E402

from pollux.train import (  # noqa: E402
    AdaptiveDataLoader,
    BatchConfig,
    InvalidValueError,
    UsageError,
    default_batch_config,
    plan_step,
)


class Indices(Dataset):
    """Sample i is the integer i, so batches say exactly which samples they hold."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class Stream(IterableDataset):
    """A deterministic stream of n integers whose order depends on the epoch."""

    def __init__(self, n):
        self.n = n
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)
        self.epoch = epoch

    def __iter__(self):
        offset = self.epoch * 1000
        return iter(range(offset, offset + self.n))


def loaders(dataset, replicas, config, state=None, **kwargs):
    out = []
    for rank in range(replicas):
        loader = AdaptiveDataLoader(
            dataset, config, rank=rank, num_replicas=replicas, seed=7, **kwargs
        )
        if state is not None:
            loader.load_state_dict(state)
        out.append(loader)
    return out


def run_steps(group, steps=None):
    """Advance every replica's loader by `steps` optimizer steps (all, if None); return samples."""
    seen = []
    iters = [loader.micro_batches() for loader in group]
    done = 0
    while steps is None or done < steps:
        step_samples = []
        for it in iters:
            micro = next(it, None)
            while micro is not None:
                step_samples.extend(micro.data.tolist())
                if micro.info.is_last:
                    break
                micro = next(it, None)
        if not step_samples and all(loader.position == 0 for loader in group):
            break
        for loader in group:
            loader.finish_step()
        seen.extend(step_samples)
        done += 1
    for it in iters:
        it.close()
    return seen


def test_a_regular_step_interleaves_replicas_micro_batch_by_micro_batch():
    config = BatchConfig(local_bsz=4, accum_steps=2)
    plans = [plan_step(10, 100, 3, rank, config) for rank in range(3)]
    assert all(p.regular and p.samples == 24 for p in plans)
    assert plans[0].slices == ((0, 4), (12, 4))
    assert plans[2].slices == ((8, 4), (20, 4))


def test_the_tail_of_an_epoch_is_split_as_evenly_as_possible():
    config = BatchConfig(local_bsz=4, accum_steps=2)
    plans = [plan_step(90, 10, 3, rank, config) for rank in range(3)]
    assert not any(p.regular for p in plans)
    sizes = [sum(n for _, n in p.slices) for p in plans]
    assert sizes == [4, 3, 3]
    assert [len(p.slices) for p in plans] == [1, 1, 1]
    # Fewer samples than replicas: the last replica has nothing to do.
    tiny = [plan_step(99, 2, 3, rank, config) for rank in range(3)]
    assert [p.slices for p in tiny] == [((0, 1),), ((1, 1),), ()]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 120),
    replicas=st.integers(1, 5),
    configs=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 3)), min_size=1, max_size=6),
)
def test_any_sequence_of_configurations_covers_the_epoch_exactly_once(n, replicas, configs):
    pos, covered, i = 0, [], 0
    while pos < n:
        m, s = configs[i % len(configs)]
        i += 1
        plans = [plan_step(pos, n - pos, replicas, r, BatchConfig(m, s)) for r in range(replicas)]
        for p in plans:
            assert all(size <= m for _, size in p.slices)
            assert len(p.slices) <= s
            covered.extend(pos + off + k for off, size in p.slices for k in range(size))
        pos += plans[0].samples
    assert sorted(covered) == list(range(n))


def test_resume_on_other_replicas_and_batch_size_uses_every_sample_exactly_once():
    data = Indices(203)
    first = loaders(data, 2, BatchConfig(local_bsz=8))
    seen = run_steps(first, steps=5)  # 5 steps × 16 samples
    assert len(seen) == 80
    state = first[0].state_dict()
    assert state["position"] == 80
    assert all(loader.state_dict() == state for loader in first)  # every replica agrees

    second = loaders(data, 3, BatchConfig(local_bsz=5, accum_steps=2), state=state)
    seen += run_steps(second)
    counts = Counter(seen)
    assert sorted(counts) == list(range(203))
    assert set(counts.values()) == {1}
    assert all(loader.epoch == 1 and loader.position == 0 for loader in second)
    assert second[0].samples_total == 203


def test_each_epoch_has_its_own_permutation_and_the_same_one_on_every_replica():
    a, b = loaders(Indices(50), 2, BatchConfig(5))
    assert torch.equal(a.order(0), b.order(0))
    assert not torch.equal(a.order(0), a.order(1))
    assert sorted(a.order(3).tolist()) == list(range(50))
    again = AdaptiveDataLoader(Indices(50), BatchConfig(5), seed=7)
    assert torch.equal(again.order(2), a.order(2))


def test_the_batch_size_changes_only_at_a_step_boundary():
    (loader,) = loaders(Indices(100), 1, BatchConfig(local_bsz=4, accum_steps=2))
    it = loader.micro_batches()
    first = next(it)
    loader.set_batch_config(BatchConfig(local_bsz=10))
    second = next(it)
    assert (first.info.size, second.info.size) == (4, 4)  # the step finishes as it began
    assert second.info.is_last
    third = next(it)
    assert third.info.size == 10
    assert third.info.plan.config == BatchConfig(10)
    it.close()


def test_leaving_mid_step_replays_the_step_and_finished_steps_count():
    (loader,) = loaders(Indices(40), 1, BatchConfig(local_bsz=4, accum_steps=2))
    it = loader.micro_batches()
    step_one = [next(it).data.tolist(), next(it).data.tolist()]
    half = next(it).data.tolist()  # first micro-batch of step two
    it.close()
    assert loader.position == 8  # step one finished when step two was asked for
    it = loader.micro_batches()
    assert next(it).data.tolist() == half  # step two starts over
    it.close()
    assert step_one[0] != half


def test_iterable_dataset_resumes_by_skipping_ahead():
    stream = Stream(61)
    first = loaders(stream, 2, BatchConfig(local_bsz=4))
    seen = run_steps(first, steps=3)
    state = first[0].state_dict()
    assert state["position"] == 24
    assert state["dataset_len"] is None
    second = loaders(stream, 3, BatchConfig(local_bsz=3, accum_steps=2), state=state)
    seen += run_steps(second)
    assert Counter(seen) == Counter(range(61))
    assert second[0].epoch == 1
    assert stream.epochs[-1] == 0  # set_epoch was called for the epoch being read


def test_iterable_dataset_with_one_worker_keeps_the_order():
    stream = Stream(20)
    stream.set_epoch(0)
    (plain,) = loaders(stream, 1, BatchConfig(3))
    (worker,) = loaders(stream, 1, BatchConfig(3), num_workers=1)
    assert [b.tolist() for b in plain] == [b.tolist() for b in worker]
    with pytest.raises(InvalidValueError, match="0 or 1 workers"):
        AdaptiveDataLoader(stream, BatchConfig(3), num_workers=2)


def test_worker_processes_serve_the_same_batches_and_follow_config_changes():
    (plain,) = loaders(Indices(37), 1, BatchConfig(4))
    (workers,) = loaders(Indices(37), 1, BatchConfig(4), num_workers=2)
    want = [b.tolist() for b in plain]
    got = []
    for i, batch in enumerate(workers):
        got.append(batch.tolist())
        if i == 2:
            workers.set_batch_config(BatchConfig(6))
    assert got[:3] == want[:3]
    assert sorted(x for b in got for x in b) == list(range(37))
    assert len(got[3]) == 6


def test_a_state_from_another_dataset_is_rejected():
    (loader,) = loaders(Indices(30), 1, BatchConfig(4))
    state = loader.state_dict()
    (other,) = loaders(Indices(31), 1, BatchConfig(4))
    with pytest.raises(InvalidValueError, match="same dataset"):
        other.load_state_dict(state)
    with pytest.raises(InvalidValueError, match="seed"):
        AdaptiveDataLoader(Indices(30), BatchConfig(4), seed=8).load_state_dict(state)


def test_iterating_twice_at_once_is_an_error():
    (loader,) = loaders(Indices(30), 1, BatchConfig(4))
    it = iter(loader)
    next(it)
    with pytest.raises(UsageError):
        next(iter(loader))
    it.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"local_bsz": 0}, "local_bsz"),
        ({"local_bsz": 4, "accum_steps": 0}, "accum_steps"),
        ({"local_bsz": 2.5}, "local_bsz"),
        ({"local_bsz": 4, "lr_scale": -1.0}, "lr_scale"),
    ],
    ids=["zero-batch", "zero-accumulation", "fractional-batch", "negative-lr-scale"],
)
def test_invalid_batch_configs_name_the_field(kwargs, field):
    with pytest.raises(InvalidValueError, match=field):
        BatchConfig(**kwargs)


def test_default_config_keeps_the_initial_total_batch():
    assert default_batch_config(128, 3) == BatchConfig(43, 1)
    assert default_batch_config(128, 4).total(4) == 128
