"""etcd's Maintenance service over one connection: member status, compaction, defragmentation.

The policy that decides when to use them is `pollux.service.maintenance`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aetcd import rpc

from pollux.service.etcd.errors import StoreError
from pollux.service.etcd.kv import EtcdKV


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One etcd member's storage, from its Status call.

    Attributes:
        member_id: The member's id.
        revision: The cluster's current revision.
        db_size: Bytes of the member's database file.
        db_in_use: Bytes of it in use (the rest is reclaimed by defragmenting).
        alarms: Active alarm names ("NOSPACE", "CORRUPT").
    """

    member_id: int
    revision: int
    db_size: int
    db_in_use: int
    alarms: tuple[str, ...]


class EtcdMaintenance:
    """Maintenance calls to the member `kv` is connected to.

    Args:
        kv: The connection (one member's endpoint: defragmentation is per member).
    """

    def __init__(self, kv: EtcdKV) -> None:
        self._kv = kv

    async def _alarms(self) -> list[Any]:
        reply = await self._kv.call(
            "Alarm", rpc.AlarmRequest(action=rpc.AlarmRequest.GET, memberID=0, alarm=rpc.NONE)
        )
        return list(reply.alarms)

    async def member_status(self) -> MemberStatus:
        """Storage and alarms of the member this connection reaches."""
        status = await self._kv.call("Status", rpc.StatusRequest())
        alarms = await self._alarms()
        return MemberStatus(
            member_id=int(status.header.member_id),
            revision=int(status.header.revision),
            db_size=int(status.dbSize),
            db_in_use=int(status.dbSizeInUse),
            alarms=tuple(
                sorted({rpc.AlarmType.Name(a.alarm) for a in alarms if a.alarm != rpc.NONE})
            ),
        )

    async def compact(self, revision: int) -> None:
        """Drop the history before `revision` (physical: done when this returns)."""
        try:
            await self._kv.call(
                "Compact", rpc.CompactionRequest(revision=revision, physical=True), timeout=60.0
            )
        except StoreError as error:
            if "required revision has been compacted" not in str(error):
                raise

    async def defragment(self) -> None:
        """Give the member's free pages back to the file system (blocks it a while)."""
        await self._kv.call("Defragment", rpc.DefragmentRequest(), timeout=120.0)

    async def disarm_nospace(self) -> None:
        """Clear every member's NOSPACE alarm (etcd never clears it by itself)."""
        for alarm in await self._alarms():
            if alarm.alarm == rpc.NOSPACE:
                await self._kv.call(
                    "Alarm",
                    rpc.AlarmRequest(
                        action=rpc.AlarmRequest.DEACTIVATE,
                        memberID=alarm.memberID,
                        alarm=rpc.NOSPACE,
                    ),
                )
