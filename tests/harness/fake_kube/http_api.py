"""The HTTP face of the fake: Kubernetes REST paths, discovery, list/watch, errors as Status.

One catch-all route parses `/api/v1/...` and `/apis/<group>/<version>/...` itself, because
`/api/v1/namespaces/<name>` (a namespace) and `/api/v1/namespaces/<ns>/<plural>` (a
namespaced collection) cannot be told apart by a route pattern alone.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.harness.fake_kube import errors
from tests.harness.fake_kube.cluster import Cluster
from tests.harness.fake_kube.errors import ApiError
from tests.harness.fake_kube.rbac import Access, Rbac, request_verb
from tests.harness.fake_kube.resources import VERBS, ResourceType
from tests.harness.fake_kube.selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from tests.harness.fake_kube.store import Watcher

_TRUE = ("true", "1")
_JSON_TYPES = ("application/json", "application/yaml", "")


@dataclass(frozen=True, slots=True)
class Target:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _json(body: Any, *, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


def _required(body: Any) -> Any:
    if body is None:
        raise errors.bad_request("the request has no body")
    return body


def _client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def _error(err: ApiError) -> web.Response:
    return _json(err.status(), status=err.code)


class KubeHttpApi:
    def __init__(
        self, cluster: Cluster, *, bookmark_interval_s: float, watch_timeout_s: float
    ) -> None:
        self.cluster = cluster
        self.bookmark_interval_s = bookmark_interval_s
        self.watch_timeout_s = watch_timeout_s
        # None: any request is served. Else the bearer tokens the server accepts now; any
        # other request is answered 401, as the real server answers an expired token.
        self.accepted_tokens: frozenset[str] | None = None
        # None: every authenticated request is allowed. Else requests its rules do not cover
        # are answered 403 Forbidden; `accesses` records each request authorized, and whether
        # it was allowed.
        self.rbac: Rbac | None = None
        self.accesses: list[tuple[Access, bool]] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.cluster.request_log.append(
            (request.method, request.path_qs, request.headers.get("Content-Type", ""))
        )
        try:
            if self.accepted_tokens is not None:
                scheme, _, token = request.headers.get("Authorization", "").partition(" ")
                if scheme.lower() != "bearer" or token not in self.accepted_tokens:
                    raise errors.unauthorized()
            fault = self.cluster.take_fault(request.method, request.path_qs)
            if fault is not None and fault.action == "drop_answer":
                await self._dispatch(request)  # done, and the answer never arrives
                if request.transport is not None:
                    request.transport.close()
                return web.Response(status=500)
            if fault is not None and fault.action == "slow_answer":
                response = await self._dispatch(request)  # done at once, answered late
                await asyncio.sleep(fault.stall_s)
                return response
            if fault is not None and fault.action == "empty":
                return web.Response(status=200)
            if fault is not None and fault.action != "error":
                if fault.action == "stall":
                    # Silent until the time is up or the client gives up and hangs up.
                    loop = asyncio.get_running_loop()
                    until = loop.time() + fault.stall_s
                    while loop.time() < until and not _client_gone(request):
                        await asyncio.sleep(0.05)
                if request.transport is not None:
                    request.transport.close()
                return web.Response(status=500)  # never reaches the client
            if fault is not None:
                response = _error(fault.error())
                if fault.retry_after_s is not None:
                    response.headers["Retry-After"] = str(fault.retry_after_s)
                return response
            return await self._dispatch(request)
        except ApiError as err:
            return _error(err)

    # -- routing -------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return web.Response(text="ok")
        if parts == ["version"]:
            return _json(
                {
                    "major": "1",
                    "minor": "33",
                    "gitVersion": "v1.33.0-fake",
                    "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean",
                    "buildDate": "2025-04-23T00:00:00Z",
                    "goVersion": "go1.24.2",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                }
            )
        if parts == ["api"]:
            return _json(
                {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
            )
        if parts == ["apis"]:
            return _json(self._group_list())
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) == 2:
            return _json(self._group(parts[1]))
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(
                404, reason="NotFound", message="the server could not find the requested resource"
            )
        if not rest:
            return _json(self._resource_list(group, version))
        target = self._target(group, version, rest)
        if self.rbac is not None:
            self._authorize(request, target)
        return await self._serve(request, target)

    def _authorize(self, request: web.Request, target: Target) -> None:
        resource = target.rtype.plural
        if target.subresource:
            resource += f"/{target.subresource}"
        named = target.name is not None
        watch = request.query.get("watch", "").lower() in _TRUE
        access = Access(
            request_verb(request.method, named=named, watch=watch),
            target.rtype.group,
            resource,
            target.namespace,
            target.name,
        )
        assert self.rbac is not None
        allowed = self.rbac.allows(access)
        self.accesses.append((access, allowed))
        if not allowed:
            raise self.rbac.forbidden(access)

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        def rtype_of(plural: str) -> ResourceType:
            rtype = self.cluster.registry.lookup(group, version, plural)
            if rtype is None:
                raise ApiError(
                    404,
                    reason="NotFound",
                    message="the server could not find the requested resource",
                )
            return rtype

        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and self.cluster.registry.lookup(group, version, rest[2]) is not None
        ):
            rtype = rtype_of(rest[2])
            if not rtype.namespaced:
                raise ApiError(
                    404,
                    reason="NotFound",
                    message="the server could not find the requested resource",
                )
            name = rest[3] if len(rest) > 3 else None
            sub = rest[4] if len(rest) > 4 else None
            if len(rest) > 5:
                raise ApiError(404, reason="NotFound", message="no such path")
            return Target(rtype, rest[1], name, sub)
        rtype = rtype_of(rest[0])
        if len(rest) > 3:
            raise ApiError(404, reason="NotFound", message="no such path")
        return Target(
            rtype, None, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        )

    # -- discovery -----------------------------------------------------------------------

    def _group(self, group: str) -> dict[str, Any]:
        versions = self.cluster.registry.group_versions().get(group)
        if versions is None:
            raise ApiError(
                404, reason="NotFound", message="the server could not find the requested resource"
            )
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def _group_list(self) -> dict[str, Any]:
        groups = [self._group(group) for group in self.cluster.registry.group_versions() if group]
        for group in groups:
            group.pop("kind")
            group.pop("apiVersion")
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        types = self.cluster.registry.in_group_version(group, version)
        if not types:
            raise ApiError(
                404, reason="NotFound", message="the server could not find the requested resource"
            )
        resources: list[dict[str, Any]] = []
        for rtype in types:
            entry: dict[str, Any] = {
                "name": rtype.plural,
                "singularName": rtype.singular,
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": VERBS,
            }
            if rtype.short_names:
                entry["shortNames"] = list(rtype.short_names)
            resources.append(entry)
            if rtype.has_status:
                resources.append(
                    {
                        "name": f"{rtype.plural}/status",
                        "singularName": "",
                        "namespaced": rtype.namespaced,
                        "kind": rtype.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if rtype.scale is not None:
                resources.append(
                    {
                        "name": f"{rtype.plural}/scale",
                        "singularName": "",
                        "namespaced": rtype.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        group_version = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }

    # -- resources -----------------------------------------------------------------------

    async def _body(self, request: web.Request, *, required: bool = True) -> Any:
        raw = await request.read()
        if not raw:
            if required:
                raise errors.bad_request("the request has no body")
            return None
        try:
            return json.loads(raw)
        except ValueError as err:
            raise errors.bad_request(f"the body is not valid JSON: {err}") from err

    def _content_type(self, request: web.Request) -> str:
        return request.headers.get("Content-Type", "").split(";")[0].strip().lower()

    async def _serve(self, request: web.Request, target: Target) -> web.StreamResponse:
        params = request.query
        if (
            request.method == "GET"
            and target.name is None
            and params.get("watch", "").lower() in _TRUE
        ):
            return await self._watch(request, target)
        directive = params.get("fieldValidation", "Warn")
        if directive not in ("Ignore", "Warn", "Strict"):
            raise errors.bad_request(
                f"fieldValidation must be Ignore, Warn or Strict, not {directive!r}"
            )
        body = await self._body(request, required=False)
        # Nothing awaits from here on, so the directive and the warnings are this request's.
        self.cluster.field_validation = directive
        self.cluster.warnings = []
        try:
            response = self._serve_now(request, target, body)
        finally:
            self.cluster.field_validation = "Warn"
        for warning in dict.fromkeys(self.cluster.warnings):
            escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
            response.headers.add("Warning", f'299 - "{escaped}"')
        return response

    def _serve_now(self, request: web.Request, target: Target, body: Any) -> web.Response:
        cluster = self.cluster
        method = request.method
        params = request.query
        rtype, ns, name, sub = target.rtype, target.namespace, target.name, target.subresource
        if sub is not None and not (
            (sub == "status" and rtype.has_status) or (sub == "scale" and rtype.scale)
        ):
            raise ApiError(
                404, reason="NotFound", message="the server could not find the requested resource"
            )
        if params.get("dryRun"):
            # Refused rather than ignored: ignoring it would write what the client only
            # meant to try.
            raise errors.bad_request("dryRun is not supported by the fake API server")
        if method in ("POST", "PUT") and self._content_type(request) not in _JSON_TYPES:
            raise errors.unsupported_media_type(
                self._content_type(request), ["application/json", "application/yaml"]
            )
        if name is None:
            if method == "GET":
                return _json(self._list(target, params))
            if method == "POST":
                created = cluster.create(rtype, ns, _required(body))
                return _json(created, status=201)
            if method == "DELETE":
                options = body
                deleted = cluster.delete_collection(
                    rtype,
                    ns,
                    label_selector=params.get("labelSelector"),
                    field_selector=params.get("fieldSelector"),
                    options=options,
                )
                return _json(self._list_body(rtype, deleted))
            raise errors.method_not_allowed(method)
        if sub == "scale":
            if method == "GET":
                return _json(cluster.get_scale(rtype, ns, name))
            if method == "PUT":
                return _json(cluster.replace_scale(rtype, ns, name, _required(body)))
            if method == "PATCH":
                return _json(
                    cluster.patch_scale(
                        rtype,
                        ns,
                        name,
                        _required(body),
                        content_type=self._content_type(request),
                    )
                )
            raise errors.method_not_allowed(method)
        if method == "GET":
            return _json(cluster.get(rtype, ns, name))
        if method == "PUT":
            return _json(cluster.replace(rtype, ns, name, _required(body), subresource=sub))
        if method == "PATCH":
            return _json(
                cluster.patch(
                    rtype,
                    ns,
                    name,
                    _required(body),
                    content_type=self._content_type(request),
                    subresource=sub,
                )
            )
        if method == "DELETE" and sub is None:
            options = body or {}
            if "propagationPolicy" in params:
                options["propagationPolicy"] = params["propagationPolicy"]
            if "gracePeriodSeconds" in params:
                try:
                    options["gracePeriodSeconds"] = int(params["gracePeriodSeconds"])
                except ValueError as err:
                    raise errors.bad_request("gracePeriodSeconds must be an integer") from err
            gone = cluster.delete(rtype, ns, name, options=options)
            if rtype.custom or rtype.key == "/pods":
                return _json(gone)
            # Other built-in types answer a delete with a success Status, not the object.
            return _json(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {
                        "name": name,
                        "group": rtype.group,
                        "kind": rtype.plural,
                        "uid": gone["metadata"]["uid"],
                    },
                }
            )
        raise errors.method_not_allowed(method)

    def _list_body(
        self,
        rtype: ResourceType,
        items: list[dict[str, Any]],
        *,
        continue_token: str | None = None,
        remaining: int | None = None,
    ) -> dict[str, Any]:
        if not rtype.custom:
            # Built-in lists carry kind and apiVersion on the list only, not on each item.
            items = [{k: v for k, v in i.items() if k not in ("kind", "apiVersion")} for i in items]
        metadata: dict[str, Any] = {"resourceVersion": str(self.cluster.store.resource_version)}
        if continue_token:
            metadata["continue"] = continue_token
            metadata["remainingItemCount"] = remaining
        return {
            "kind": rtype.list_kind,
            "apiVersion": rtype.api_version,
            "metadata": metadata,
            "items": items,
        }

    def _list(self, target: Target, params: Any) -> dict[str, Any]:
        items = self.cluster.list_objects(
            target.rtype,
            target.namespace,
            label_selector=params.get("labelSelector"),
            field_selector=params.get("fieldSelector"),
        )
        start_after = None
        if params.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(params["continue"]))
                start_after = tuple(token["after"])
            except (ValueError, KeyError, TypeError) as err:
                raise errors.bad_request("invalid continue token") from err
        if start_after is not None:
            items = [
                i
                for i in items
                if (i["metadata"].get("namespace", ""), i["metadata"]["name"]) > start_after
            ]
        try:
            limit = int(params.get("limit") or 0)
        except ValueError as err:
            raise errors.bad_request("limit must be an integer") from err
        if limit > 0 and len(items) > limit:
            page, rest = items[:limit], items[limit:]
            last = page[-1]["metadata"]
            token = base64.urlsafe_b64encode(
                json.dumps({"after": [last.get("namespace", ""), last["name"]]}).encode()
            ).decode()
            return self._list_body(target.rtype, page, continue_token=token, remaining=len(rest))
        return self._list_body(target.rtype, items)

    # -- watch ---------------------------------------------------------------------------

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        cluster = self.cluster
        store = cluster.store
        params = request.query
        rtype = target.rtype
        labels = parse_label_selector(params.get("labelSelector"))
        fields = parse_field_selector(params.get("fieldSelector"), resource_key=rtype.key)
        rv_text = params.get("resourceVersion", "")
        try:
            timeout_s = (
                float(params["timeoutSeconds"])
                if "timeoutSeconds" in params
                else (self.watch_timeout_s)
            )
            since = int(rv_text) if rv_text not in ("", "0") else None
        except ValueError as err:
            raise errors.bad_request(f"invalid watch parameter: {err}") from err
        bookmarks = params.get("allowWatchBookmarks", "").lower() in _TRUE

        def matches(obj: dict[str, Any]) -> bool:
            return labels_match(labels, obj["metadata"].get("labels")) and fields_match(
                fields, cluster.present(rtype, obj)
            )

        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(event_type: str, obj: dict[str, Any]) -> None:
            line = json.dumps({"type": event_type, "object": obj}) + "\n"
            await response.write(line.encode())

        if since is not None and since < store.compacted_resource_version:
            await send("ERROR", errors.expired(since, store.compacted_resource_version).status())
            await response.write_eof()
            return response

        watcher = Watcher(cluster.storage_key(rtype), target.namespace, matches)
        # Replaying and registering happen without an await in between, so no change is
        # lost or sent twice.
        if since is None:
            for obj in store.items(cluster.storage_key(rtype), target.namespace):
                if matches(obj):
                    watcher.queue.put_nowait(("ADDED", obj))
        else:
            for change in store.changes_since(since):
                watcher.offer(change)
        store.add_watcher(watcher)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                wait_s = min(remaining, self.bookmark_interval_s) if bookmarks else remaining
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), timeout=wait_s)
                except TimeoutError:
                    if bookmarks and deadline - loop.time() > 0:
                        await send(
                            "BOOKMARK",
                            {
                                "kind": rtype.kind,
                                "apiVersion": rtype.api_version,
                                "metadata": {"resourceVersion": str(store.resource_version)},
                            },
                        )
                    continue
                if item is None:
                    break  # the server closed this watch
                event_type, obj = item
                await send(event_type, cluster.present(rtype, obj))
            await response.write_eof()
        except ConnectionResetError:
            pass
        finally:
            store.remove_watcher(watcher)
        return response
