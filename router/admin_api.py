"""Runtime instance management: add, remove, drain/undrain (control-authenticated).

=======  =============================================  ==============================
method   path                                           body
=======  =============================================  ==============================
POST     /kairos/v1/admin/instances                     ``{"name": "i2", "url": "http://h:p"}``
DELETE   /kairos/v1/admin/instances/{name}              —
POST     /kairos/v1/admin/instances/{name}/drain        ``{"draining": true}`` (default true)
=======  =============================================  ==============================

Removing an instance moves its agents elsewhere (held ones keep their order);
draining stops new placements and moves its held agents, while its ongoing
agents finish where they are.
"""

from __future__ import annotations

from aiohttp import web

from kairos_common.wire import API_PREFIX
from router.auth import ControlAuth, Role
from router.control_api import read_json_object
from router.errors import BadRequestError
from router.ports import InstanceAdmin


class AdminApi:
    """Admin-credential-only handlers (``--control-token-file`` or ``admin.token``).

    Handed the three membership operations it exposes, not the core behind them.
    """

    def __init__(self, instances: InstanceAdmin, auth: ControlAuth) -> None:
        self._instances = instances
        self.auth = auth

    def routes(self) -> list[web.RouteDef]:
        p = f"{API_PREFIX}/admin/instances"
        return [
            web.post(p, self.add),
            web.delete(f"{p}/{{name}}", self.remove),
            web.post(f"{p}/{{name}}/drain", self.drain),
        ]

    async def add(self, request: web.Request) -> web.Response:
        self.auth.require(request, Role.ADMIN)
        obj = await read_json_object(request)
        name, url = obj.get("name"), obj.get("url")
        if not isinstance(name, str) or not isinstance(url, str):
            raise BadRequestError("need string fields 'name' and 'url'")
        inst = self._instances.add_instance(name, url)
        self.auth.credentials.write_daemon_file(inst.name)
        return web.json_response({"ok": True, "instance": inst.name, "url": inst.base_url})

    async def remove(self, request: web.Request) -> web.Response:
        self.auth.require(request, Role.ADMIN)
        self._instances.remove_instance(request.match_info["name"])
        return web.json_response({"ok": True})

    async def drain(self, request: web.Request) -> web.Response:
        self.auth.require(request, Role.ADMIN)
        obj = await read_json_object(request)
        draining = obj.get("draining", True)
        if not isinstance(draining, bool):
            raise BadRequestError("'draining' must be a boolean")
        inst = self._instances.set_draining(request.match_info["name"], draining)
        return web.json_response({"ok": True, "instance": inst.name, "draining": inst.draining})
