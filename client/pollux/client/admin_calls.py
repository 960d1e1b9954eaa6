"""The AdminService calls of the client: tokens, tenants, usage and audit (admin role).

WhoAmI, and a user's own usage, answer anyone; the rest need an admin's token. Each call goes
through the transport's failover like the scheduler calls (transport.py).
"""

from __future__ import annotations

from datetime import datetime

from pollux.client.transport import Transport
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import types_pb2 as pb


class AdminCalls(Transport):
    """The AdminService calls (arguments: `Transport`)."""

    def whoami(self) -> apb.WhoAmIResponse:
        """Who the scheduler takes this client for."""
        response: apb.WhoAmIResponse = self._unary("WhoAmI", apb.WhoAmIRequest(), admin=True)
        return response

    def create_token(
        self,
        user: str,
        *,
        role: str = "user",
        tenant: str = "",
        ttl_s: int = 0,
        description: str = "",
    ) -> apb.CreateTokenResponse:
        """Issue a token; its secret is in the response only."""
        request = apb.CreateTokenRequest(
            user=user, role=role, tenant=tenant, ttl_s=ttl_s, description=description
        )
        response: apb.CreateTokenResponse = self._unary("CreateToken", request, admin=True)
        return response

    def revoke_token(self, token_id: str) -> None:
        """Revoke a token (by id or text)."""
        self._unary("RevokeToken", apb.RevokeTokenRequest(token_id=token_id), admin=True)

    def list_tokens(self, user: str = "") -> list[pb.ApiToken]:
        """Tokens, without secrets."""
        return list(self._unary("ListTokens", apb.ListTokensRequest(user=user), admin=True).tokens)

    def put_tenant(
        self, name: str, *, guarantee_gpus: int = 0, weight: float = 1.0, cap_gpus: int = 0
    ) -> pb.Tenant:
        """Create or replace a tenant."""
        tenant = pb.Tenant(
            name=name, guarantee_gpus=guarantee_gpus, weight=weight, cap_gpus=cap_gpus
        )
        stored: pb.Tenant = self._unary(
            "PutTenant", apb.PutTenantRequest(tenant=tenant), admin=True
        ).tenant
        return stored

    def delete_tenant(self, name: str) -> None:
        """Remove a tenant."""
        self._unary("DeleteTenant", apb.DeleteTenantRequest(name=name), admin=True)

    def list_tenants(self) -> list[pb.Tenant]:
        """Every tenant."""
        return list(self._unary("ListTenants", apb.ListTenantsRequest(), admin=True).tenants)

    def usage(
        self, *, tenant: str = "", user: str = "", since: datetime | None = None
    ) -> list[pb.UsageRecord]:
        """GPU-seconds and goodput-seconds per (tenant, user) since a day."""
        request = apb.GetUsageRequest(tenant=tenant, user=user)
        if since is not None:
            request.since.FromDatetime(since)
        return list(self._unary("GetUsage", request, admin=True).usage)

    def audit(self, limit: int = 100) -> list[pb.AuditRecord]:
        """The newest audit records, newest first."""
        return list(self._unary("ListAudit", apb.ListAuditRequest(limit=limit), admin=True).records)
