"""The ``/_fake/...`` control endpoints of the fake Kubernetes API server, and their client.

Not a real API server feature: when the fake runs as its own process
(``python -m tests.fakes.apiserver``), tests drive its state and faults over HTTP with
:class:`FakeControl`, which mirrors the direct methods of
:class:`~tests.fakes.apiserver.FakeApiServer`. Errors come back as ``Status`` objects and
are raised as :class:`~tests.fakes.apiserver_errors.ApiError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

from tests.fakes.apiserver_errors import ApiError, reason_for, status_body
from tests.fakes.apiserver_http import (
    Receive,
    Scope,
    Send,
    parse_json,
    read_body,
    respond_json,
    truthy,
)
from tests.fakes.apiserver_resources import Obj


class ControlEndpoints:
    """The ``/_fake/...`` side of :class:`~tests.fakes.apiserver.FakeApiServer`."""

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        op = scope["path"][len("/_fake/"):].strip("/")
        qs = scope.get("query_string", b"").decode("latin-1")
        q = {k: v[-1] for k, v in parse_qs(qs, keep_blank_values=True).items()}
        raw = await read_body(receive)
        try:
            body = parse_json(raw) if raw.strip() else None
            result = self._control_op(op, q, body)
        except ApiError as err:
            await respond_json(send, err.code, err.status())
            return
        except (KeyError, TypeError, ValueError) as exc:
            await respond_json(send, 400, status_body(400, "BadRequest", repr(exc)))
            return
        finally:
            self._notify()
        await respond_json(send, 200, result)

    def _control_op(self, op: str, q: Mapping[str, str], body: Any) -> Any:
        ns = q.get("namespace") or None
        if op == "state":
            return {"url": self.url, "resourceVersion": self.store.rv,
                    "watches": self.open_watches(), "stalled": self._stalled,
                    "installed": sorted(self.store.installed)}
        if op == "create":
            return self.create(body, field_manager=q.get("fieldManager", "fake-test"))
        if op == "apply":
            return self.apply(body, field_manager=q.get("fieldManager", "fake-test"),
                              force=truthy(q.get("force")))
        if op == "put-raw":
            return self.put_raw(body)
        if op == "set-status":
            return self.set_status(q["plural"], ns, q["name"], body)
        if op == "delete":
            return self.delete(q["plural"], ns, q["name"])
        if op == "objects":
            return {"items": self.objects(q["plural"], ns,
                                          label_selector=q.get("labelSelector"))}
        if op == "object":
            obj = self.get(q["plural"], ns, q["name"])
            if obj is None:
                raise ApiError(404, "NotFound", f'{q["plural"]} "{q["name"]}" not found')
            return obj
        if op == "namespaces":
            return self.create_namespace(q["name"])
        if op == "stall":
            self.stall_watches()
        elif op == "unstall":
            self.unstall_watches()
        elif op == "compact":
            return {"resourceVersion": self.compact()}
        elif op == "reset":
            names = q.get("namespaces")
            return {"resourceVersion": self.reset_state(
                keep_crds=q.get("keepCrds", "true").lower() != "false",
                namespaces=None if names is None else [n for n in names.split(",") if n])}
        elif op == "close-watches":
            self.close_watches(q.get("plural"))
        elif op == "uninstall-crd":
            self.uninstall_crd(q["plural"], keep_objects=truthy(q.get("keepObjects")))
        elif op == "install-crd":
            self.install_crd(q["plural"])
        elif op == "token":
            self.set_token((body or {}).get("token") if body is not None else q.get("token"))
        elif op == "deny":
            self.deny(body["verb"], body["plural"], body.get("namespace"))
        elif op == "allow":
            self.allow()
        elif op == "inject":
            raw_body = body.get("body")
            if isinstance(body.get("raw"), str):
                raw_body = body["raw"].encode()
            self.inject(body.get("method", "*"), body["path_regex"], status=int(body["status"]),
                        body=raw_body, headers=body.get("headers"),
                        times=body.get("times", 1), query_contains=body.get("query_contains"),
                        hang=bool(body.get("hang", False)))
        elif op == "clear-injections":
            self.clear_injections()
        elif op == "requests":
            return [r.to_json() for r in self.requests]
        elif op == "clear-requests":
            self.clear_requests()
        else:
            raise ApiError(404, "NotFound", f"unknown control operation {op!r}")
        return {"ok": True}


class FakeControl:
    """Drive a fake API server running as its own process, over ``/_fake/...``."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    async def _call(self, method: str, op: str, *, params: Mapping[str, Any] | None = None,
                    body: Any = None) -> Any:
        import httpx

        async with httpx.AsyncClient(base_url=self.url, timeout=10.0) as client:
            resp = await client.request(
                method, f"/_fake/{op}",
                params={k: v for k, v in (params or {}).items() if v is not None},
                content=None if body is None else json.dumps(body).encode(),
                headers={"content-type": "application/json"})
        data = resp.json()
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, data.get("reason", reason_for(resp.status_code)),
                           data.get("message", ""))
        return data

    async def state(self) -> Obj:
        return dict(await self._call("GET", "state"))

    async def create(self, obj: Obj) -> Obj:
        return dict(await self._call("POST", "create", body=obj))

    async def apply(self, obj: Obj, *, field_manager: str = "fake-test",
                    force: bool = False) -> Obj:
        return dict(await self._call("POST", "apply", body=obj, params={
            "fieldManager": field_manager, "force": "true" if force else None}))

    async def put_raw(self, obj: Obj) -> Obj:
        return dict(await self._call("POST", "put-raw", body=obj))

    async def set_status(self, plural: str, namespace: str | None, name: str,
                         status: Obj) -> Obj:
        return dict(await self._call("POST", "set-status", body=status, params={
            "plural": plural, "namespace": namespace, "name": name}))

    async def delete(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        result = await self._call("POST", "delete", params={
            "plural": plural, "namespace": namespace, "name": name})
        return dict(result) if result else None

    async def objects(self, plural: str, namespace: str | None = None, *,
                      label_selector: str | None = None) -> list[Obj]:
        data = await self._call("GET", "objects", params={
            "plural": plural, "namespace": namespace, "labelSelector": label_selector})
        return list(data["items"])

    async def get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        try:
            return dict(await self._call("GET", "object", params={
                "plural": plural, "namespace": namespace, "name": name}))
        except ApiError as err:
            if err.code == 404:
                return None
            raise

    async def create_namespace(self, name: str) -> Obj:
        return dict(await self._call("POST", "namespaces", params={"name": name}))

    async def stall_watches(self) -> None:
        await self._call("POST", "stall")

    async def unstall_watches(self) -> None:
        await self._call("POST", "unstall")

    async def compact(self) -> int:
        return int((await self._call("POST", "compact"))["resourceVersion"])

    async def reset_state(self, *, keep_crds: bool = True,
                          namespaces: Iterable[str] | None = None) -> int:
        params = {"keepCrds": "true" if keep_crds else "false",
                  "namespaces": None if namespaces is None else ",".join(namespaces)}
        return int((await self._call("POST", "reset", params=params))["resourceVersion"])

    async def close_watches(self, plural: str | None = None) -> None:
        await self._call("POST", "close-watches", params={"plural": plural})

    async def uninstall_crd(self, plural: str, *, keep_objects: bool = False) -> None:
        await self._call("POST", "uninstall-crd", params={
            "plural": plural, "keepObjects": "true" if keep_objects else None})

    async def install_crd(self, plural: str) -> None:
        await self._call("POST", "install-crd", params={"plural": plural})

    async def set_token(self, token: str | None) -> None:
        self.token = token
        await self._call("POST", "token", body={"token": token})

    async def deny(self, verb: str, plural: str, namespace: str | None = None) -> None:
        await self._call("POST", "deny", body={"verb": verb, "plural": plural,
                                               "namespace": namespace})

    async def allow(self) -> None:
        await self._call("POST", "allow")

    async def inject(self, method: str, path_regex: str, *, status: int,
                     body: bytes | Obj | None = None, headers: Mapping[str, str] | None = None,
                     times: int | None = 1, query_contains: str | None = None,
                     hang: bool = False) -> None:
        payload: Obj = {"method": method, "path_regex": path_regex, "status": status,
                        "headers": dict(headers) if headers else None, "times": times,
                        "query_contains": query_contains, "hang": hang}
        if isinstance(body, bytes):
            payload["raw"] = body.decode()
        else:
            payload["body"] = body
        await self._call("POST", "inject", body=payload)

    async def clear_injections(self) -> None:
        await self._call("POST", "clear-injections")

    async def requests(self) -> list[Obj]:
        return list(await self._call("GET", "requests"))

    async def clear_requests(self) -> None:
        await self._call("POST", "clear-requests")


__all__ = ["ControlEndpoints", "FakeControl"]
