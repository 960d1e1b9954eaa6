"""Who is calling: principals, the credentials that prove them, and the checks on them.

Every RPC of a service with TLS on is authenticated before its handler runs
(`pollux.service.rpc.RpcObserver` calls an `Authenticator`), and the handler reads the caller
with `current()`. Three kinds of credential exist: a **certificate** of the cluster CA
(`pollux.service.pki`; its subject names the holder and its role; services present one on
every hop); a person's **API token**, ``pollux_<id>_<secret>`` sent as ``authorization:
Bearer``, of which etcd keeps only the secret's SHA-256 and only schedulers verify; and a
**job credential**, ``pjc.<job id>.<hmac>`` under a cluster key, with which an agent tells
with no lookup that a report comes from the job it names. A service without TLS (loopback
only, or ``--insecure``) authenticates nobody: every caller is `LOCAL`, an admin
(docs/architecture.md §9).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from pollux.service.errors import PermissionDenied, Unauthenticated
from pollux.service.pki import PkiError, identity_of

ADMIN, USER, SERVICE, JOB = "admin", "user", "service", "job"
TOKEN_PREFIX = "pollux_"
JOB_CREDENTIAL_PREFIX = "pjc."
HOW_JOBS_AUTHENTICATE = (
    "replicas send the job credential their launcher gives them (POLLUX_JOB_CREDENTIAL; "
    "pollux.train does so by itself)"
)
HOW_SERVICES_AUTHENTICATE = "callers present a certificate of the cluster CA"
HOW_TO_AUTHENTICATE = (
    "pollux-cli sends the token of its current context (~/.config/pollux/config.toml, "
    "written by pollux-up) or of POLLUX_TOKEN; an admin issues one with "
    "`pollux-cli admin token create USER`"
)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller.

    Attributes:
        name: User name, service name, or the job id of a job credential.
        role: `ADMIN`, `USER`, `SERVICE` or `JOB`.
        tenant: A user's tenant (from the token); "" for the default tenant.
        via: How it was proved: "token", "certificate", "job-credential" or "none".
    """

    name: str
    role: str
    tenant: str = ""
    via: str = "none"

    @property
    def is_admin(self) -> bool:
        """Whether it may act on everything."""
        return self.role == ADMIN


LOCAL = Principal("local", ADMIN)
"""Every caller of a service without authentication (TLS off)."""
ANONYMOUS = Principal("anonymous", "anonymous")
"""A caller not (yet) authenticated: what the audit log names when authentication fails."""

_current: ContextVar[Principal] = ContextVar("pollux_principal", default=LOCAL)


def current() -> Principal:
    """The caller of the RPC being handled (`LOCAL` outside an authenticated call)."""
    return _current.get()


def bind(principal: Principal) -> Any:
    """Make `principal` the current caller; returns the token to `unbind` with."""
    return _current.set(principal)


def unbind(token: Any) -> None:
    """Undo a `bind` (a stream may resume in another context: then there is nothing to undo)."""
    with contextlib.suppress(ValueError):
        _current.reset(token)


# -- API tokens --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewToken:
    """A freshly made token: the text for the user, the parts to store."""

    id: str
    text: str
    digest: bytes


def token_digest(secret: str) -> bytes:
    """What is stored of a token's secret.

    A plain SHA-256 suffices: secrets are 256 random bits, so there is nothing to brute-force
    that a slow hash would protect.
    """
    return hashlib.sha256(secret.encode()).digest()


def new_token() -> NewToken:
    """A new random token."""
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return NewToken(token_id, f"{TOKEN_PREFIX}{token_id}_{secret}", token_digest(secret))


def parse_token(text: str) -> tuple[str, str] | None:
    """(id, secret) of a token's text, or None if it is not shaped like one."""
    if not text.startswith(TOKEN_PREFIX):
        return None
    token_id, sep, secret = text[len(TOKEN_PREFIX) :].partition("_")
    if not sep or len(token_id) != 12 or not secret or len(secret) > 128:
        return None
    if any(c not in "0123456789abcdef" for c in token_id):
        return None
    return token_id, secret


def token_matches(secret: str, digest: bytes) -> bool:
    """Whether `secret` is the one `digest` was made from (constant time)."""
    return hmac.compare_digest(token_digest(secret), digest)


# -- job credentials ---------------------------------------------------------------------------


def job_credential(key: bytes, job_id: str) -> str:
    """The credential of a job's replicas: valid for that job's agent calls only."""
    mac = hmac.new(key, b"job:" + job_id.encode(), hashlib.sha256).hexdigest()
    return f"{JOB_CREDENTIAL_PREFIX}{job_id}.{mac}"


def job_of_credential(key: bytes, text: str) -> str | None:
    """The job a credential was made for, or None if it is not one of ours."""
    if not text.startswith(JOB_CREDENTIAL_PREFIX):
        return None
    job_id, sep, _ = text[len(JOB_CREDENTIAL_PREFIX) :].rpartition(".")
    if not sep or not job_id:
        return None
    return job_id if hmac.compare_digest(job_credential(key, job_id), text) else None


# -- authenticating a call ---------------------------------------------------------------------


def bearer(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The bearer credential of a call's metadata, if any."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, credential = text.partition(" ")
            if scheme.lower() == "bearer" and credential.strip():
                return credential.strip()
            raise Unauthenticated("the authorization header must be 'Bearer <token>'")
    return None


def certificate_principal(context: grpc.aio.ServicerContext[Any, Any]) -> Principal | None:
    """The identity of a verified client certificate, if the caller presented one."""
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    try:
        identity = identity_of(pems[0])
    except PkiError as error:
        raise Unauthenticated(f"client certificate refused: {error}") from error
    return Principal(identity.name, identity.role, via="certificate")


class TokenVerifier(Protocol):
    """Checks a person's token (scheduler replicas only); raises Unauthenticated.

    `max_age_s` bounds how old a cached token record may be (None: the verifier's own cache
    time): an open stream re-proves its token with a fresher bound (pollux.service.rpc).
    """

    def __call__(self, text: str, *, max_age_s: float | None = None) -> Awaitable[Principal]:
        """The principal `text` proves."""
        ...


JobKey = Callable[[], Awaitable[bytes]]
"""The cluster's job-credential key (services that accept job credentials)."""
JobEnded = Callable[[str], Awaitable[str | None]]
"""Why a job's credential no longer holds (its job ended or was deleted), or None while the
job is live: a job credential dies with its job."""


class Authenticator:
    """Turns a call's credentials into a `Principal`, or refuses it.

    Args:
        tokens: Verifies API tokens; None on services that accept none (launcher, agent).
        job_key: The job-credential key; None on services that accept no job credentials.
        job_ended: Why a job's credential no longer holds (None: it holds); given where job
            credentials are accepted, so a finished or deleted job's credential is refused.
        roles: The roles that may call this service at all (None: any).
    """

    def __init__(
        self,
        *,
        tokens: TokenVerifier | None = None,
        job_key: JobKey | None = None,
        job_ended: JobEnded | None = None,
        roles: tuple[str, ...] | None = None,
    ) -> None:
        self._tokens = tokens
        self._job_key = job_key
        self._job_ended = job_ended
        self._roles = roles
        self._hint = (
            HOW_TO_AUTHENTICATE
            if tokens is not None
            else HOW_JOBS_AUTHENTICATE
            if job_key is not None
            else HOW_SERVICES_AUTHENTICATE
        )

    async def authenticate(
        self, context: grpc.aio.ServicerContext[Any, Any], *, max_age_s: float | None = None
    ) -> Principal:
        """The caller, proved by its certificate or bearer credential, if its role may call.

        Args:
            context: The call.
            max_age_s: Trust no cached token record older than this (None: the cache time).

        Raises:
            Unauthenticated: No credential, or one that is not valid here (a token revoked
                or expired, a job credential whose job has ended).
            PermissionDenied: A valid identity whose role may not call this service.
        """
        principal = await self._prove(context, max_age_s)
        if self._roles is not None:
            require_role(principal, self._roles, "calling this service")
        return principal

    async def _prove(
        self, context: grpc.aio.ServicerContext[Any, Any], max_age_s: float | None
    ) -> Principal:
        by_certificate = certificate_principal(context)
        credential = bearer(context)
        if credential is None:
            if by_certificate is not None:
                return by_certificate
            raise Unauthenticated(f"no credential: {self._hint}")
        if credential.startswith(JOB_CREDENTIAL_PREFIX) and self._job_key is not None:
            job_id = job_of_credential(await self._job_key(), credential)
            if job_id is None:
                raise Unauthenticated("the job credential is not valid for any job")
            if self._job_ended is not None:
                ended = await self._job_ended(job_id)
                if ended is not None:
                    raise Unauthenticated(
                        f"the credential of job {job_id} died with its job: the job {ended}"
                    )
            return Principal(job_id, JOB, via="job-credential")
        if credential.startswith(TOKEN_PREFIX) and self._tokens is not None:
            return await self._tokens(credential, max_age_s=max_age_s)
        raise Unauthenticated(f"this service does not accept that kind of credential: {self._hint}")


# -- authorisation -----------------------------------------------------------------------------


def require_own_job(principal: Principal, job_id: str, method: str) -> None:
    """A job credential acts on its own job only: refuse a request that names another."""
    if principal.role == JOB and job_id != principal.name:
        raise PermissionDenied(
            f"{method}: the credential of job {principal.name} may not act on "
            f"{job_id[:64] or 'no job'}"
        )


def require_admin(principal: Principal, action: str) -> None:
    """Refuse `action` unless the caller is an admin."""
    if not principal.is_admin:
        raise PermissionDenied(
            f"{action} needs the admin role; {principal.name} is a {principal.role}"
        )


def require_role(principal: Principal, roles: tuple[str, ...], action: str) -> None:
    """Refuse `action` unless the caller has one of `roles`."""
    if principal.role not in roles:
        raise PermissionDenied(
            f"{action} is for {' or '.join(roles)} callers; {principal.name} is a {principal.role}"
        )


def may_act_on_job(principal: Principal, owner: str) -> bool:
    """Whether the caller may see and change a job owned by `owner`."""
    return principal.is_admin or (principal.role == USER and principal.name == owner)


def require_job_access(principal: Principal, job_id: str, owner: str, action: str) -> None:
    """Refuse `action` on a job unless the caller owns it or is an admin."""
    if not may_act_on_job(principal, owner):
        raise PermissionDenied(
            f"{action} of job {job_id}: it belongs to {owner or 'nobody'}, and "
            f"{principal.name} ({principal.role}) may only act on their own jobs"
        )
