"""Python client of the Pollux API and the pollux-cli command.

from pollux.client import Client, JobSpec

with Client("127.0.0.1:7070") as pollux:
job = pollux.submit(JobSpec("train", ("python", "train.py"), 256, max_batch_size=4096))
"""

from pollux.client.client import Client, JobEvent
from pollux.client.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PolluxError,
    ResourceExhaustedError,
    UnavailableError,
)
from pollux.client.types import (
    Allocation,
    ClusterStatus,
    Explanation,
    Job,
    JobEstimate,
    JobSpec,
    NodeStatus,
    Transition,
)
from pollux.jobspec import Mount

__all__ = [
    "Allocation",
    "AlreadyExistsError",
    "Client",
    "ClusterStatus",
    "Explanation",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "Job",
    "JobEstimate",
    "JobEvent",
    "JobSpec",
    "Mount",
    "NodeStatus",
    "NotFoundError",
    "PolluxError",
    "ResourceExhaustedError",
    "Transition",
    "UnavailableError",
]
