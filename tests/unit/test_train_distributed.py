"""A real two-process gloo run: DDP gradients, GNS from per-replica gradients, metrics, tails."""

import faulthandler
import os
import socket

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from pollux.train import (  # noqa: E402
    BatchConfig,
    ElasticTrainer,
    EnvVarError,
    FixedBatchConfig,
    InMemorySink,
    TrainEnv,
    estimate,
    init,
    shutdown,
)
from pollux.train.gns import VAR_FLOOR  # noqa: E402

SAMPLES = 65  # two regular steps of 32, then a one-sample tail that rank 1 sits out
INIT_BATCH = 16
LR = 0.05


def dataset():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, 5, generator=gen)
    y = x @ torch.randn(5, 1, generator=gen) + 0.3 * torch.randn(SAMPLES, 1, generator=gen)
    return TensorDataset(x, y)


def new_model():
    torch.manual_seed(11)
    return nn.Linear(5, 1)


def flat_grad(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()]).clone()


def communication_threads():
    """Names of this process's c10d threads (gloo, TCPStore), or None off Linux."""
    if not os.path.isdir("/proc/self/task"):
        return None
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:  # a thread that ended while we listed
            continue
    return sorted(n for n in names if n.startswith(("gloo", "pt_")))


def worker(rank, port, out_dir):
    faulthandler.enable()  # a native abort prints every thread's Python stack
    torch.set_num_threads(1)
    env = TrainEnv(rank=rank, world_size=2, master_port=port, job_id="dist-test")
    model = new_model()
    reference = new_model()  # a plain copy, to compute each micro-batch's local gradient
    sink = InMemorySink()
    trainer = ElasticTrainer(
        model,
        torch.optim.SGD(model.parameters(), lr=LR),
        dataset(),
        init_batch_size=INIT_BATCH,
        env=env,
        batch_source=FixedBatchConfig(BatchConfig(local_bsz=8, accum_steps=2)),
        scaling_rule="none",  # so that the run can be replayed exactly below
        metrics_sink=sink,
        report_interval_s=0.05,
        checkpointing=False,
        handle_sigterm=False,
        profile_warmup_steps=0,
    )
    result = {"micro_grads": [], "synced_grad": None, "steps": []}
    for i, (x, y) in enumerate(trainer.batches()):
        if i < 2:  # the first optimizer step: two micro-batches on this replica
            reference.zero_grad()
            nn.functional.mse_loss(reference(x), y).backward()
            result["micro_grads"].append(flat_grad(reference))
        trainer.backward(nn.functional.mse_loss(trainer.model(x), y))
        if i == 1:
            result["synced_grad"] = flat_grad(model)  # after DDP's all-reduce
        stepped = trainer.step()
        if i == 1:
            assert stepped
            result["gns_after_first_step"] = (trainer.gns.stats.sqr, trainer.gns.stats.var)
        if stepped:
            result["steps"].append(trainer.steps)
    trainer.close()  # flushes the metrics
    result["params"] = torch.cat([p.detach().flatten() for p in model.parameters()])
    result["order"] = trainer.loader.order(0)
    result["observations"] = sink.observations()
    result["progress"] = trainer.progress
    result["final_steps"] = trainer.steps
    result["epoch"] = trainer.epoch
    dist.barrier()
    shutdown()
    result["threads_after_shutdown"] = communication_threads()
    torch.save(result, out_dir / f"rank{rank}.pt")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("dist")
    mp.start_processes(worker, args=(free_port(), out_dir), nprocs=2, start_method="spawn")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_ddp_gradients_are_equal_and_are_the_mean_of_all_micro_batches(results):
    a, b = results
    assert torch.allclose(a["synced_grad"], b["synced_grad"], atol=1e-7)
    micro = torch.stack(a["micro_grads"] + b["micro_grads"])  # 4 gradients of 8 samples
    assert torch.allclose(a["synced_grad"], micro.mean(0), atol=1e-6)


def test_noise_scale_comes_from_the_per_replica_micro_batch_gradients(results):
    a, b = results
    micro = torch.stack(a["micro_grads"] + b["micro_grads"]).double()
    local = float(micro.square().sum(1).mean())  # L over c = 2 replicas × 2 micro-batches
    total = float(micro.mean(0).square().sum())  # T
    sqr, var = estimate(local, total, 4, 32 / INIT_BATCH)
    want = (max(sqr, 0.0), max(var, VAR_FLOOR))  # the first average is the raw estimate
    for r in results:
        assert r["gns_after_first_step"] == pytest.approx(want, rel=1e-4)


def test_replicas_end_identical_and_match_a_single_process_replay(results):
    a, b = results
    assert torch.equal(a["params"], b["params"])
    assert a["steps"] == [1, 2, 3]
    # Rank 1 had no sample in the 1-sample tail, yet took part in its update.
    assert b["steps"] == [1, 2]
    assert a["final_steps"] == b["final_steps"] == 3
    assert a["progress"] == pytest.approx(b["progress"])
    assert a["epoch"] == b["epoch"] == 1
    # Replay: plain SGD on the mean gradient of each step's samples, in the loader's order.
    model = new_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = dataset().tensors
    order = a["order"]
    for start, size in ((0, 32), (32, 32), (64, 1)):
        idx = order[start : start + size]
        opt.zero_grad()
        nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
        opt.step()
    replay = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.allclose(a["params"], replay, atol=1e-5)


def test_rank_zero_reported_step_times_for_its_configuration(results):
    observations = results[0]["observations"]
    obs = observations[(1, 2, 8, 2)]  # one node, two replicas, 8 per micro-batch, 2 micro-batches
    assert obs.count == 2  # the two regular steps; the irregular tail is not timed
    assert obs.optim_step_time_s > 0
    assert obs.accum_step_time_s > 0
    assert results[1]["observations"] == {}  # only rank 0 reports


def test_leaving_the_group_after_close_stops_every_communication_thread(results):
    # A gloo or TCPStore thread alive at interpreter shutdown can abort a replica that has
    # finished (SIGABRT, exit 134): the job would fail. DDP pulls in torch.distributed.nn,
    # which pinned the world group when imported after it was created (pollux.train now
    # imports it first), and the trainer's DDP wrapper held it until `close` dropped it.
    threads = [r["threads_after_shutdown"] for r in results]
    if threads[0] is None:
        pytest.skip("thread names are read from /proc (Linux)")
    assert threads == [[], []]


# -- the environment contract every replica starts with (docs/architecture.md §7) ----------


def test_shutdown_without_a_process_group_is_harmless():
    assert not dist.is_initialized()
    shutdown()  # a one-replica job never joined a group
    assert not dist.is_initialized()


def test_environment_contract_is_read_with_defaults_for_a_standalone_run(tmp_path):
    assert TrainEnv.from_environ({}) == TrainEnv()
    env = TrainEnv.from_environ(
        {
            "POLLUX_JOB_ID": "job-7",
            "POLLUX_AGENT_ADDR": "10.0.0.2:7000",
            "POLLUX_CHECKPOINT_DIR": str(tmp_path),
            "POLLUX_ALLOCATION_GEN": "4",
            "POLLUX_NUM_NODES": "2",
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29400",
            "CUDA_VISIBLE_DEVICES": "2,3",
        }
    )
    assert env.job_id == "job-7"
    assert env.checkpoint_dir == tmp_path
    assert (env.rank, env.world_size, env.local_rank, env.num_nodes) == (3, 4, 1, 2)
    assert env.cuda_visible_devices == ("2", "3")
    assert env.distributed
    assert TrainEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""}).cuda_visible_devices == ()


def test_a_secure_cluster_gives_the_ca_file_and_the_jobs_credential(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    env = TrainEnv.from_environ({"POLLUX_TLS_CA": str(ca), "POLLUX_JOB_CREDENTIAL": "pjc.j.x"})
    assert (env.tls_ca, env.job_credential) == (ca, "pjc.j.x")
    with pytest.raises(EnvVarError, match="POLLUX_TLS_CA"):
        TrainEnv.from_environ({"POLLUX_TLS_CA": str(tmp_path)})  # a directory, not the CA


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"RANK": "two"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
        ({"POLLUX_ALLOCATION_GEN": "-1"}, "POLLUX_ALLOCATION_GEN"),
        ({"POLLUX_NUM_NODES": "3", "WORLD_SIZE": "2", "RANK": "0"}, "POLLUX_NUM_NODES"),
        ({"POLLUX_JOB_ID": "a job"}, "POLLUX_JOB_ID"),
    ],
    ids=[
        "rank-not-a-number",
        "rank-not-below-world-size",
        "empty-world",
        "port-out-of-range",
        "negative-generation",
        "more-nodes-than-replicas",
        "job-id-with-space",
    ],
)
def test_malformed_environment_names_the_variable(environ, variable):
    with pytest.raises(EnvVarError) as info:
        TrainEnv.from_environ(environ)
    assert info.value.variable == variable
    assert variable in str(info.value)


def test_checkpoint_dir_that_is_a_file_is_rejected(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(EnvVarError, match="not a directory"):
        TrainEnv.from_environ({"POLLUX_CHECKPOINT_DIR": str(path)})


class Rescale(nn.Module):
    """A layer with a buffer: DDP broadcasts buffers at the start of synchronised forwards."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return x * self.scale


def tail_worker(rank, port, samples, with_buffer, out_dir):
    faulthandler.enable()
    torch.set_num_threads(1)
    env = TrainEnv(rank=rank, world_size=2, master_port=port, job_id="tail-test")
    init(env, timeout_s=20)  # a collective mismatch fails in 20 s instead of hanging
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(samples, 4), torch.randint(0, 2, (samples,)))
    layers = [nn.Linear(4, 4), *([Rescale()] if with_buffer else []), nn.Linear(4, 2)]
    model = nn.Sequential(*layers)
    trainer = ElasticTrainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        init_batch_size=2,
        env=env,
        connect_agent=False,
        checkpointing=False,
        handle_sigterm=False,
        shuffle=False,
    )
    for _ in trainer.epochs(2):
        for x, y in trainer.batches():
            trainer.step(nn.functional.cross_entropy(trainer.model(x), y))
    trainer.close()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    # Both ranks leave together: a rank that tears its gloo pairs down while its peer is
    # still inside a collective makes the peer's process abort ("terminate called ...").
    dist.barrier()
    shutdown()
    result = {"steps": trainer.steps, "params": params, "threads": communication_threads()}
    torch.save(result, out_dir / f"tail{rank}.pt")


@pytest.mark.parametrize(
    ("samples", "with_buffer"),
    [
        pytest.param(5, True, id="a model with buffers, one sample left for two replicas"),
        pytest.param(3, False, id="the tail right after the first synchronised step"),
    ],
)
def test_an_epoch_tail_that_leaves_a_replica_without_samples_does_not_deadlock(
    tmp_path, samples, with_buffer
):
    # In the last step of an epoch a replica can get no sample at all; DDP's forward would
    # issue collectives (buffer broadcast, bucket rebuild) that such a replica never reaches.
    mp.start_processes(
        tail_worker,
        args=(free_port(), samples, with_buffer, tmp_path),
        nprocs=2,
        start_method="spawn",
    )
    ranks = [torch.load(tmp_path / f"tail{r}.pt") for r in range(2)]
    assert ranks[0]["steps"] == ranks[1]["steps"] == 2 * ((samples + 1) // 2)
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])
    assert all(r["threads"] in ([], None) for r in ranks)  # nothing outlives `shutdown`
