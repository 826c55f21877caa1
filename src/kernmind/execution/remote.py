"""``--kernel-gateway``: the parts that put Python sessions on a kernel gateway, built from settings
(docs/deployment.md, "Kernels on a gateway").

``RemoteKernels.from_settings(settings)`` makes the gateway client, the kernel factory the warm
pool uses instead of the local one and the shared directory for sessions' files; ``registry(...)``
is shared by every replica through PostgreSQL (``sessions/shared.py``) when ``--db`` names one,
else this process's own, as with local kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernmind.budget import Budget
from kernmind.config import Settings
from kernmind.execution.kernels.gateway.client import GatewayConfig, GatewayUnavailable, KernelGateway
from kernmind.execution.kernels.gateway.kernels import GatewayKernelFactory, SharedWorkspaces
from kernmind.execution.sessions.postgres_rows import SessionRows
from kernmind.execution.sessions.registry import SessionRegistry
from kernmind.execution.sessions.session import Hooks
from kernmind.execution.sessions.shared import SharedSessionRegistry

STORE_SPARE_CONNECTIONS = 4  # beyond one per session held at once: reads, the reaper


@dataclass
class RemoteKernels:
    settings: Settings
    gateway: KernelGateway
    workspaces: SharedWorkspaces
    factory: GatewayKernelFactory

    @classmethod
    def from_settings(cls, settings: Settings) -> RemoteKernels:
        assert settings.kernel_gateway is not None
        config = GatewayConfig(
            url=settings.kernel_gateway,
            token=settings.kernel_gateway_token,
            request_timeout=settings.kernel_gateway_request_timeout,
            start_timeout=settings.kernel_gateway_start_timeout,
            max_message_bytes=max(64 * 1024 * 1024, 4 * settings.max_result_bytes),
        )
        gateway = KernelGateway(config)
        workspaces = SharedWorkspaces(
            settings.gateway_workspaces_dir, settings.kernel_gateway_kernel_workspaces
        )
        factory = GatewayKernelFactory(
            gateway,
            settings.kernel_gateway_kernel,
            workspaces,
            Budget.of(settings),
            env=settings.kernel_gateway_env,
        )
        return cls(settings, gateway, workspaces, factory)

    @property
    def shared(self) -> bool:
        """Whether sessions are shared with other replicas (a PostgreSQL ``--db``)."""
        return self.settings.db_is_postgres

    @property
    def version(self) -> str:
        return (
            f"Python on {self.settings.kernel_gateway} (kernelspec {self.settings.kernel_gateway_kernel!r})"
        )

    def registry(self, *, hooks: Hooks) -> SessionRegistry | SharedSessionRegistry:
        """Sessions for remote kernels: not in the local store (their files are on the shared
        volume); shared with the other replicas through PostgreSQL when ``--db`` is one."""
        common: dict[str, Any] = {
            "max_sessions": self.settings.max_sessions,
            "max_per_owner": self.settings.principal_max_sessions,
            "idle_timeout": self.settings.idle_timeout,
            "autosave_after": self.settings.autosave_seconds,
            "new_workspace": self.workspaces.new,
            "hooks": hooks,
        }
        if not self.shared:
            return SessionRegistry(store=None, **common)
        assert self.settings.db is not None
        records = SessionRows(
            self.settings.db, max_connections=self.settings.max_sessions + STORE_SPARE_CONNECTIONS
        )
        return SharedSessionRegistry(records, self.factory, **common)

    async def kernelspec(self) -> dict[str, Any]:
        """For ``kernmind doctor``: the gateway's kernelspec for Python sessions (``GatewayUnavailable``
        when the gateway cannot be reached or has no such kernelspec)."""
        specs = (await self.gateway.kernelspecs()).get("kernelspecs", {})
        name = self.settings.kernel_gateway_kernel
        if name not in specs:
            known = ", ".join(sorted(specs)) or "none"
            raise GatewayUnavailable(
                f"the gateway has no kernelspec {name!r} (it has: {known}); set --kernel-gateway-kernel"
            )
        return dict(specs[name].get("spec", {}))
