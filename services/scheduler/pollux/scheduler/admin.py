"""AdminService over gRPC: tokens, tenants, usage and the audit log.

Served by every scheduler replica; writes are plain etcd writes (no leadership needed). Every
RPC but WhoAmI (and a user's own usage) is for admins; the RPC observer has authenticated the
caller before any handler runs, and audits every mutation.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, TypeAlias

import grpc

from pollux.scheduler.accounting import day_of
from pollux.scheduler.tokens import TokenBook
from pollux.service import auth
from pollux.service.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Violations,
)
from pollux.service.keys import Kind
from pollux.service.store import Delete, Expect, Put, Store
from pollux.terminal import quoted
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from pollux.v1 import types_pb2 as pb

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
USER_NAME = re.compile(r"[a-z][a-z0-9._-]{0,62}")
TENANT_NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
MAX_TTL_S = 10 * 365 * 86400
MAX_TENANT_GPUS = 1_000_000
MAX_AUDIT = 1000
ACTIONS = frozenset(
    {
        "SubmitJob",
        "CancelJob",
        "DeleteJob",
        "CreateToken",
        "RevokeToken",
        "PutTenant",
        "DeleteTenant",
    }
)
"""The mutations the audit log records (pollux.service.audit)."""


class AdminServicer(apb_grpc.AdminServiceServicer):
    """The AdminService RPCs of one scheduler replica.

    Args:
        store: The cluster state.
        tokens: The replica's token book (a revoke here is refused here at once).
        clock: Wall-clock seconds.
    """

    def __init__(
        self, store: Store, tokens: TokenBook, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.tokens = tokens
        self.clock = clock

    async def WhoAmI(self, request: apb.WhoAmIRequest, context: Context) -> apb.WhoAmIResponse:
        """The caller as this server sees it."""
        me = auth.current()
        return apb.WhoAmIResponse(name=me.name, role=me.role, tenant=me.tenant, via=me.via)

    # -- tokens ----------------------------------------------------------------------------

    async def CreateToken(
        self, request: apb.CreateTokenRequest, context: Context
    ) -> apb.CreateTokenResponse:
        """A new token; its secret is in this response only."""
        me = auth.current()
        auth.require_admin(me, "CreateToken")
        role = request.role or auth.USER
        v = Violations()
        v.check(
            USER_NAME.fullmatch(request.user) is not None,
            "user",
            f"{quoted(request.user)} is not a user name "
            "(1-63 of [a-z0-9._-], starting with a letter)",
        )
        v.check(role in (auth.USER, auth.ADMIN), "role", f"{quoted(role)} must be user or admin")
        v.check(request.ttl_s <= MAX_TTL_S, "ttl_s", f"at most {MAX_TTL_S} (10 years); 0: never")
        v.check(len(request.description) <= 256, "description", "at most 256 characters")
        if request.tenant:
            v.check(
                TENANT_NAME.fullmatch(request.tenant) is not None,
                "tenant",
                f"{quoted(request.tenant)} is not a tenant name",
            )
        v.raise_if_any()
        if (
            request.tenant
            and await self.store.get(self.store.keys.tenant(request.tenant), pb.Tenant) is None
        ):
            raise NotFound(
                f"tenant {quoted(request.tenant)} does not exist: create it first "
                "(pollux-cli admin tenant put)"
            )
        made = auth.new_token()
        record = pb.ApiToken(
            id=made.id,
            user=request.user,
            role=role,
            tenant=request.tenant,
            secret_sha256=made.digest,
            description=request.description,
            created_by=me.name,
        )
        now = self.clock()
        record.create_time.FromNanoseconds(int(now * 1e9))
        if request.ttl_s:
            record.expire_time.FromNanoseconds(int((now + request.ttl_s) * 1e9))
        key = self.store.keys.token(made.id)
        await self.store.txn([Put(key, record.SerializeToString())], expect=[Expect(key, 0)])
        shown_record = pb.ApiToken()
        shown_record.CopyFrom(record)
        shown_record.ClearField("secret_sha256")
        return apb.CreateTokenResponse(token=shown_record, secret=made.text)

    async def RevokeToken(
        self, request: apb.RevokeTokenRequest, context: Context
    ) -> apb.RevokeTokenResponse:
        """Delete a token (by id or by its whole text)."""
        auth.require_admin(auth.current(), "RevokeToken")
        parsed = auth.parse_token(request.token_id)
        token_id = parsed[0] if parsed else request.token_id
        if not re.fullmatch(r"[0-9a-f]{12}", token_id):
            raise InvalidArgument([("token_id", "a 12-hex-digit token id or a whole token")])
        key = self.store.keys.token(token_id)
        entry = await self.store.get(key, pb.ApiToken)
        if entry is None:
            raise NotFound(f"token {token_id} not found (pollux-cli admin token ls)")
        await self.store.txn([Delete(key)], expect=[Expect(key, entry.mod_revision)])
        self.tokens.forget(token_id)
        return apb.RevokeTokenResponse()

    async def ListTokens(
        self, request: apb.ListTokensRequest, context: Context
    ) -> apb.ListTokensResponse:
        """Tokens, without their digests."""
        auth.require_admin(auth.current(), "ListTokens")
        entries, _ = await self.store.scan(self.store.keys.prefix(Kind.TOKENS), pb.ApiToken)
        out = apb.ListTokensResponse()
        for entry in sorted(
            entries, key=lambda e: (e.value.user, e.value.create_time.ToNanoseconds())
        ):
            if request.user and entry.value.user != request.user:
                continue
            shown_record = out.tokens.add()
            shown_record.CopyFrom(entry.value)
            shown_record.ClearField("secret_sha256")
        return out

    # -- tenants ---------------------------------------------------------------------------

    async def PutTenant(
        self, request: apb.PutTenantRequest, context: Context
    ) -> apb.PutTenantResponse:
        """Create or replace a tenant."""
        auth.require_admin(auth.current(), "PutTenant")
        tenant = pb.Tenant()
        tenant.CopyFrom(request.tenant)
        v = Violations()
        v.check(
            TENANT_NAME.fullmatch(tenant.name) is not None,
            "tenant.name",
            f"{quoted(tenant.name)} is not a tenant name "
            "(1-63 of [a-z0-9-], starting with a letter)",
        )
        if tenant.weight == 0:
            tenant.weight = 1.0
        v.check(
            0 < tenant.weight <= 1e6 and tenant.weight == tenant.weight,
            "tenant.weight",
            "must be > 0 and at most 1e6 (0: 1)",
        )
        v.check(tenant.guarantee_gpus <= MAX_TENANT_GPUS, "tenant.guarantee_gpus", "too large")
        v.check(
            tenant.cap_gpus == 0 or tenant.cap_gpus >= tenant.guarantee_gpus,
            "tenant.cap_gpus",
            f"{tenant.cap_gpus} is below the guarantee of {tenant.guarantee_gpus} (0: no cap)",
        )
        v.raise_if_any()
        key = self.store.keys.tenant(tenant.name)
        previous = await self.store.get(key, pb.Tenant)
        if previous is not None:
            tenant.create_time.CopyFrom(previous.value.create_time)
        else:
            tenant.create_time.FromNanoseconds(int(self.clock() * 1e9))
        expected = previous.mod_revision if previous is not None else 0
        # A concurrent PutTenant of the same name makes this ABORTED: re-read and retry.
        await self.store.txn([Put(key, tenant.SerializeToString())], expect=[Expect(key, expected)])
        return apb.PutTenantResponse(tenant=tenant)

    async def DeleteTenant(
        self, request: apb.DeleteTenantRequest, context: Context
    ) -> apb.DeleteTenantResponse:
        """Remove a tenant (its jobs count as the default tenant's from the next round)."""
        auth.require_admin(auth.current(), "DeleteTenant")
        key = self.store.keys.tenant(request.name) if TENANT_NAME.fullmatch(request.name) else None
        entry = await self.store.get(key, pb.Tenant) if key is not None else None
        if key is None or entry is None:
            raise NotFound(f"tenant {quoted(request.name)} not found (pollux-cli admin tenant ls)")
        await self.store.txn([Delete(key)], expect=[Expect(key, entry.mod_revision)])
        return apb.DeleteTenantResponse()

    async def ListTenants(
        self, request: apb.ListTenantsRequest, context: Context
    ) -> apb.ListTenantsResponse:
        """Every tenant (any person may see the shares)."""
        auth.require_role(auth.current(), (auth.USER, auth.ADMIN), "ListTenants")
        entries, _ = await self.store.scan(self.store.keys.prefix(Kind.TENANTS), pb.Tenant)
        tenants: list[pb.Tenant] = sorted((e.value for e in entries), key=lambda t: t.name)
        return apb.ListTenantsResponse(tenants=tenants)

    # -- usage and audit -------------------------------------------------------------------

    async def GetUsage(
        self, request: apb.GetUsageRequest, context: Context
    ) -> apb.GetUsageResponse:
        """Usage per (tenant, user) since a day; users see their own only."""
        me = auth.current()
        auth.require_role(me, (auth.USER, auth.ADMIN), "GetUsage")
        user, tenant = request.user, request.tenant
        if not me.is_admin:
            if user and user != me.name:
                raise PermissionDenied(
                    f"GetUsage of another user needs the admin role; {me.name} is a {me.role}"
                )
            user = me.name
        since = ""
        if request.HasField("since"):
            try:
                since = day_of(request.since.ToNanoseconds() / 1e9)
            except (ValueError, OverflowError, OSError):  # outside years 1-9999
                raise InvalidArgument([("since", "not a valid timestamp")]) from None
        entries, _ = await self.store.scan(self.store.keys.prefix(Kind.USAGE), pb.UsageRecord)
        totals: dict[tuple[str, str], pb.UsageRecord] = {}
        for entry in entries:
            record = entry.value
            if (
                record.day < since
                or (user and record.user != user)
                or (tenant and record.tenant != tenant)
            ):
                continue
            row = totals.setdefault(
                (record.tenant, record.user),
                pb.UsageRecord(tenant=record.tenant, user=record.user, day=since),
            )
            row.gpu_seconds += record.gpu_seconds
            row.goodput_seconds += record.goodput_seconds
        return apb.GetUsageResponse(usage=[totals[k] for k in sorted(totals)])

    async def ListAudit(
        self, request: apb.ListAuditRequest, context: Context
    ) -> apb.ListAuditResponse:
        """The newest audit records, newest first."""
        auth.require_admin(auth.current(), "ListAudit")
        limit = request.limit or 100
        if limit > MAX_AUDIT:
            raise InvalidArgument([("limit", f"at most {MAX_AUDIT}")])
        entries = await self.store.newest(
            self.store.keys.prefix(Kind.AUDIT), pb.AuditRecord, limit=limit
        )
        return apb.ListAuditResponse(records=[e.value for e in entries])
