"""What each caller may see of a job: ownership checks and secret redaction.

The one place that decides, for every SchedulerService response, whether the caller may see
a job (its owner and admins may) and what of it: values of `spec.secret_env` never leave the
scheduler (the launchers read them from etcd), whoever asks.
"""

from __future__ import annotations

from pollux.service import auth
from pollux.v1 import types_pb2 as pb

SECRET_SHOWN = "<secret>"


def redacted(job: pb.Job) -> pb.Job:
    """The job as the API returns it: secret environment values replaced."""
    if not job.spec.secret_env:
        return job
    out = pb.Job()
    out.CopyFrom(job)
    for name in out.spec.secret_env:
        out.spec.secret_env[name] = SECRET_SHOWN
    return out


def owner_filter(principal: auth.Principal) -> str | None:
    """The owner a caller's listings are limited to (None: everyone's, for admins)."""
    return None if principal.is_admin else principal.name


def check_person(principal: auth.Principal, action: str) -> None:
    """Refuse job actions to callers that are not people (services, job credentials)."""
    auth.require_role(principal, (auth.USER, auth.ADMIN), action)


def check_job(principal: auth.Principal, job: pb.Job, action: str) -> None:
    """Refuse `action` on `job` unless the caller owns it or is an admin."""
    check_person(principal, action)
    auth.require_job_access(principal, job.id, job.owner, action)
