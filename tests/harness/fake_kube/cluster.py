"""The API server's semantics without HTTP: admission, versions, conflicts, GC and controllers.

`Cluster` is what the HTTP handlers call and what tests arrange scenarios through. Every
write that comes through the API runs the emulated controllers afterwards (garbage
collector, LWS controller, scheduler) until nothing changes, unless `auto_reconcile` is off,
in which case a test drives them with `reconcile()`.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import random
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness.fake_kube import errors, kubelet, scale_subresource
from tests.harness.fake_kube.builtin_schemas import drop_unknown_fields, schema_problems
from tests.harness.fake_kube.crd import CustomResource, leaderworkerset_crd, load_crd
from tests.harness.fake_kube.errors import ApiError, Fault
from tests.harness.fake_kube.event_views import VIEW_KEY, core_to_events, events_to_core
from tests.harness.fake_kube.patching import (
    apply_patch,
)
from tests.harness.fake_kube.resources import BUILTIN_TYPES, Registry, ResourceType
from tests.harness.fake_kube.selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from tests.harness.fake_kube.store import Obj, Store

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_RECONCILE_ROUNDS = 2000  # a safety net against controllers that never settle
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _without(obj: Obj, *keys: str) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


class Cluster:
    """State and semantics of the fake API server."""

    def __init__(
        self,
        *,
        history_limit: int = 1000,
        auto_reconcile: bool = True,
        controller_delay_s: float | None = None,
        pod_ready_delay_s: float | None = 0.0,
        pod_termination_scale: float | None = None,
        namespaces: tuple[str, ...] = DEFAULT_NAMESPACES,
        clock: Callable[[], dt.datetime] | None = None,
        crd_files: tuple[Path, ...] = (),
    ) -> None:
        self.registry = Registry(BUILTIN_TYPES)
        self.store = Store(history_limit=history_limit)
        self.custom: dict[str, CustomResource] = {}
        self.auto_reconcile = auto_reconcile
        # None: controllers react inside the request that made the change. A number: they
        # react that many seconds later on the event loop, as real controllers lag behind.
        self.controller_delay_s = controller_delay_s
        self._reconcile_pending = False
        # 0: pods turn Ready when bound; > 0: that many seconds later (on the event loop);
        # None: only when a test calls set_pod_ready().
        self.pod_ready_delay_s = pod_ready_delay_s
        # None: deleted pods vanish at once. A number: a bound pod is Terminating (it has a
        # deletionTimestamp and keeps its resources) for its grace period times this scale.
        self.pod_termination_scale = pod_termination_scale
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.request_log: list[tuple[str, str, str]] = []  # (method, path, content type)
        self._reconciling = False
        self.started_groups: set[str] = set()  # LWS controller memory: leader pod uids
        self.preemptions: list[tuple[str, str]] = []  # (victim, preemptor) as "ns/name"
        self._controllers: list[Callable[[Cluster], None]] = []
        self.scheduling_dirty = True
        self.faults: list[Fault] = []
        # Per request, set by the HTTP layer: the fieldValidation directive and the warnings
        # to send back in Warning headers.
        self.field_validation = "Warn"
        self.warnings: list[str] = []
        self.store.add_listener(self._note_scheduling_input)
        self.add_custom_resource(leaderworkerset_crd())
        for path in crd_files:
            self.add_custom_resource(load_crd(path))
        for name in namespaces:
            self.create(self.registry.get("", "namespaces"), None, {"metadata": {"name": name}})

    # -- types ---------------------------------------------------------------------------

    def add_custom_resource(self, crd: CustomResource) -> None:
        self.registry.add(crd.rtype)
        self.custom[crd.rtype.key] = crd

    def rtype(self, group: str, plural: str) -> ResourceType:
        return self.registry.get(group, plural)

    def add_controller(self, controller: Callable[[Cluster], None]) -> None:
        """Run `controller(cluster)` on every reconcile pass, after the built-in ones."""
        self._controllers.append(controller)

    # -- reads ---------------------------------------------------------------------------

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        stored = self.store.get(self.storage_key(rtype), namespace or "", name)
        if stored is None:
            raise errors.not_found(rtype.plural, name, group=rtype.group)
        return self.present(rtype, stored)

    def find(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj | None:
        stored = self.store.get(self.storage_key(rtype), namespace or "", name)
        return None if stored is None else self.present(rtype, stored)

    def list_objects(
        self,
        rtype: ResourceType,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, resource_key=rtype.key)
        presented = (
            self.present(rtype, obj)
            for obj in self.store.items(self.storage_key(rtype), namespace)
            if labels_match(labels, obj["metadata"].get("labels"))
        )
        return [obj for obj in presented if fields_match(fields, obj)]

    def storage_key(self, rtype: ResourceType) -> str:
        """Where objects of this type are stored: a view type shares another's storage."""
        return "/events" if rtype.key == VIEW_KEY else rtype.key

    def _storage_type(self, rtype: ResourceType) -> ResourceType:
        return self.rtype("", "events") if rtype.key == VIEW_KEY else rtype

    def _to_storage(self, rtype: ResourceType, obj: Obj) -> Obj:
        return events_to_core(obj) if rtype.key == VIEW_KEY else obj

    def present(self, rtype: ResourceType, stored: Obj) -> Obj:
        obj = core_to_events(stored) if rtype.key == VIEW_KEY else copy.deepcopy(stored)
        obj["apiVersion"] = rtype.api_version
        obj["kind"] = rtype.kind
        return obj

    # -- writes --------------------------------------------------------------------------

    def create(
        self, rtype: ResourceType, namespace: str | None, body: Any, *, reconcile: bool = True
    ) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of a create must be a JSON object")
        self._check_type_fields(rtype, body)
        obj = self._to_storage(rtype, copy.deepcopy(body))
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        if rtype.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            namespace = namespace or body_ns
            if not namespace:
                raise errors.bad_request("a namespaced object needs a namespace")
            meta["namespace"] = namespace
            if self.store.get("/namespaces", "", namespace) is None:
                raise errors.not_found("namespaces", namespace)
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise ApiError(
                500,
                reason="InternalError",
                message="resourceVersion should not be set on objects to be created",
            )
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid(
                    rtype.kind, "", [("metadata.name", "Required value: name or generateName")]
                )
            meta["name"] = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
        name = meta["name"]
        self._check_name(rtype, name)
        if self.store.get(self.storage_key(rtype), meta.get("namespace", ""), name) is not None:
            raise errors.already_exists(rtype.plural, name, group=rtype.group)
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock())
        meta["generation"] = 1
        if rtype.has_status:
            # The status of a type with a status subresource is not settable on create.
            obj.pop("status", None)
        obj = self._admit(rtype, obj, old=None)
        self.store.write(self.storage_key(rtype), obj, change_type="ADDED")
        created = self.get(rtype, meta.get("namespace"), name)
        if reconcile:
            self.after_write()
        return created

    def replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        reconcile: bool = True,
    ) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of an update must be a JSON object")
        current = self.store.get(self.storage_key(rtype), namespace or "", name)
        if current is None:
            raise errors.not_found(rtype.plural, name, group=rtype.group)
        self._check_type_fields(rtype, body)
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})"
            )
        sent_rv = meta.get("resourceVersion")
        if sent_rv:
            if str(sent_rv) != current["metadata"]["resourceVersion"]:
                raise errors.conflict(rtype.plural, name, group=rtype.group)
        elif rtype.custom:
            raise errors.invalid(
                rtype.kind,
                name,
                [
                    (
                        "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
                group=rtype.group,
            )
        updated = self._merge_update(
            rtype, current, self._to_storage(rtype, copy.deepcopy(body)), subresource=subresource
        )
        result = self._commit_update(rtype, current, updated)
        if reconcile:
            self.after_write()
        return result

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        content_type: str,
        subresource: str | None = None,
        reconcile: bool = True,
    ) -> Obj:
        current = self.store.get(self.storage_key(rtype), namespace or "", name)
        if current is None:
            raise errors.not_found(rtype.plural, name, group=rtype.group)
        base = self.present(rtype, current)
        patched = apply_patch(base, body, content_type=content_type, custom=rtype.custom)
        self._check_type_fields(rtype, patched)
        meta = patched.get("metadata") or {}
        if meta.get("name") != name or meta.get("namespace", "") != current["metadata"].get(
            "namespace", ""
        ):
            raise errors.bad_request("a patch may not change the name or namespace")
        # A patch is conditional only when it carries a resourceVersion of its own.
        sent_rv = meta.get("resourceVersion")
        if sent_rv and str(sent_rv) != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rtype.plural, name, group=rtype.group)
        updated = self._merge_update(
            rtype, current, self._to_storage(rtype, patched), subresource=subresource
        )
        result = self._commit_update(rtype, current, updated)
        if reconcile:
            self.after_write()
        return result

    def delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        *,
        options: dict[str, Any] | None = None,
        reconcile: bool = True,
    ) -> Obj:
        current = self.store.get(self.storage_key(rtype), namespace or "", name)
        if current is None:
            raise errors.not_found(rtype.plural, name, group=rtype.group)
        options = options or {}
        preconditions = options.get("preconditions") or {}
        uid = current["metadata"]["uid"]
        if preconditions.get("uid") and preconditions["uid"] != uid:
            raise ApiError(
                409,
                reason="Conflict",
                message=(
                    f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                    f"UID in object meta: {uid}"
                ),
            )
        wanted_rv = preconditions.get("resourceVersion")
        if wanted_rv and str(wanted_rv) != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                reason="Conflict",
                message=(
                    f"Precondition failed: ResourceVersion in precondition: {wanted_rv}, "
                    f"ResourceVersion in object meta: {current['metadata']['resourceVersion']}"
                ),
            )
        if options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents"):
            self._orphan_dependents(uid)
        if rtype.key == "/pods":
            grace = kubelet.pod_grace_seconds(self, current, options)
            if grace > 0:
                terminating = kubelet.start_termination(self, current, grace)
                if reconcile:
                    self.after_write()
                return self.present(rtype, terminating)
        final = self.store.delete(self.storage_key(rtype), namespace or "", name)
        assert final is not None
        if rtype.key == "/namespaces":
            self._delete_namespace_contents(name)
        if reconcile:
            self.after_write()
        return self.present(rtype, final)

    def delete_collection(
        self,
        rtype: ResourceType,
        namespace: str | None,
        *,
        label_selector: str | None,
        field_selector: str | None,
        options: dict[str, Any] | None = None,
    ) -> list[Obj]:
        deleted = [
            self.delete(
                rtype,
                obj["metadata"].get("namespace"),
                obj["metadata"]["name"],
                options=options,
                reconcile=False,
            )
            for obj in self.list_objects(
                rtype, namespace, label_selector=label_selector, field_selector=field_selector
            )
        ]
        self.after_write()
        return deleted

    # -- /scale (see scale_subresource.py) ----------------------------------------------

    def get_scale(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        return scale_subresource.get_scale(self, rtype, namespace, name)

    def replace_scale(
        self, rtype: ResourceType, namespace: str | None, name: str, body: Any
    ) -> Obj:
        return scale_subresource.replace_scale(self, rtype, namespace, name, body)

    def patch_scale(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        content_type: str,
    ) -> Obj:
        return scale_subresource.patch_scale(
            self, rtype, namespace, name, body, content_type=content_type
        )

    # -- hooks for the controllers -------------------------------------------------------

    def after_write(self) -> None:
        if not self.auto_reconcile:
            return
        if self.controller_delay_s is None:
            self.reconcile()
            return
        if self._reconcile_pending:
            return  # one pass later covers every write until then, as a work queue does
        self._reconcile_pending = True

        def later() -> None:
            self._reconcile_pending = False
            self.reconcile()

        try:
            self.schedule_later(self.controller_delay_s, later)
        except RuntimeError:
            self._reconcile_pending = False
            self.reconcile()  # no running event loop to defer to

    def reconcile(self) -> None:
        """Run GC, the LWS and HPA controllers and the scheduler until nothing changes."""
        from tests.harness.fake_kube.garbage_collector import collect_garbage
        from tests.harness.fake_kube.hpa_controller import reconcile_hpas
        from tests.harness.fake_kube.lws_controller import reconcile_leaderworkersets
        from tests.harness.fake_kube.scheduler import schedule_pending_pods

        if self._reconciling:
            return
        self._reconciling = True
        try:
            for _ in range(_MAX_RECONCILE_ROUNDS):
                before = self.store.resource_version
                collect_garbage(self)
                reconcile_leaderworkersets(self)
                reconcile_hpas(self)
                schedule_pending_pods(self)
                for controller in self._controllers:
                    controller(self)
                if self.store.resource_version == before:
                    return
            raise RuntimeError("the fake cluster's controllers did not settle")
        finally:
            self._reconciling = False

    def write_internal(self, rtype: ResourceType, obj: Obj) -> Obj:
        """Controller write of a whole object (spec and status), skipping no-op writes."""
        current = self.store.get(
            self.storage_key(rtype), obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
        )
        if current is None:
            raise errors.not_found(rtype.plural, obj["metadata"]["name"], group=rtype.group)
        candidate = copy.deepcopy(obj)
        candidate["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        candidate.pop("apiVersion", None)
        candidate.pop("kind", None)
        stored = _without(current, "apiVersion", "kind")
        if candidate == stored:
            return self.present(rtype, current)
        return self.present(
            rtype, self.store.write(self.storage_key(rtype), candidate, change_type="MODIFIED")
        )

    def schedule_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_later(delay_s, callback)

    def _note_scheduling_input(self, change: Any) -> None:
        if change.resource_key in ("/pods", "/nodes", "scheduling.k8s.io/priorityclasses"):
            self.scheduling_dirty = True

    def inject_fault(
        self,
        *,
        code: int,
        method: str | None = None,
        path_contains: str = "",
        times: int = 1,
        retry_after_s: int | None = None,
        action: str = "error",
        stall_s: float = 0.0,
    ) -> None:
        """Test hook: answer the next `times` matching requests with this error instead.

        E.g. `inject_fault(code=409, method="PATCH", path_contains="/scale")` makes the next
        scale patch conflict; `code=429, retry_after_s=1` throttles; `code=500` fails.
        `action="disconnect"` drops the connection instead of answering (`code` unused);
        `action="stall", stall_s=5` holds it silent for 5 s first; `action="drop_answer"`
        carries the request out and then drops the connection before the answer;
        `action="slow_answer", stall_s=2` carries it out at once and answers 2 s later;
        `action="empty"` answers 200 with an empty body (a proxy closing a stream at once).
        """
        if action not in ("error", "disconnect", "stall", "drop_answer", "slow_answer", "empty"):
            raise ValueError(f"unknown fault action {action!r}")
        self.faults.append(
            Fault(method, path_contains, code, times, retry_after_s, action, stall_s)
        )

    def take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.matches(method, path):
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    def now_text(self) -> str:
        return rfc3339(self.clock())

    # -- kubelet hooks (see kubelet.py) ------------------------------------------------

    def on_pod_bound(self, pod: Obj) -> None:
        kubelet.on_pod_bound(self, pod)

    def set_pod_ready(
        self, namespace: str, name: str, *, ready: bool = True, reconcile: bool = True
    ) -> Obj:
        """Test hook: mark a bound pod's containers (un)ready, as the kubelet would."""
        return kubelet.set_pod_ready(self, namespace, name, ready=ready, reconcile=reconcile)

    def restart_container(self, namespace: str, name: str) -> Obj:
        """Test hook: a container of this running pod crashed and the kubelet restarted it."""
        return kubelet.restart_container(self, namespace, name)

    def finish_terminating(self) -> None:
        """Test hook: every terminating pod's kubelet confirms now; the pods disappear."""
        kubelet.finish_terminating(self)

    # -- internals -----------------------------------------------------------------------

    def _check_type_fields(self, rtype: ResourceType, obj: Obj) -> None:
        api_version = obj.get("apiVersion")
        kind = obj.get("kind")
        if (api_version and api_version != rtype.api_version) or (kind and kind != rtype.kind):
            raise errors.bad_request(
                f"the API version in the data ({api_version}) or kind ({kind}) does not match "
                f"the expected API version ({rtype.api_version}) and kind ({rtype.kind})"
            )

    def _check_name(self, rtype: ResourceType, name: str) -> None:
        if len(name) > 253 or not _NAME_RE.match(name):
            raise errors.invalid(
                rtype.kind,
                name,
                [
                    (
                        "metadata.name",
                        f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                        "of lower case alphanumeric characters, '-' or '.', and must start and "
                        "end with an alphanumeric character",
                    )
                ],
                group=rtype.group,
            )

    def _merge_update(
        self, rtype: ResourceType, current: Obj, body: Obj, *, subresource: str | None
    ) -> Obj:
        """The object an update stores: server-owned metadata kept, status per subresource."""
        if subresource == "status":
            updated = copy.deepcopy(current)
            if "status" in body:
                updated["status"] = body["status"]
            else:
                updated.pop("status", None)
            return updated
        updated = _without(body, "apiVersion", "kind")
        meta = updated.setdefault("metadata", {})
        for key in (
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "generation",
            "deletionTimestamp",
        ):
            if key in current["metadata"]:
                meta[key] = current["metadata"][key]
            else:
                meta.pop(key, None)
        if rtype.has_status:
            # The main resource ignores status when a status subresource exists.
            if "status" in current:
                updated["status"] = copy.deepcopy(current["status"])
            else:
                updated.pop("status", None)
        return updated

    def _commit_update(self, rtype: ResourceType, current: Obj, updated: Obj) -> Obj:
        updated = self._admit(rtype, updated, old=current)
        spec_old = _without(current, "metadata", "status", "apiVersion", "kind")
        spec_new = _without(updated, "metadata", "status", "apiVersion", "kind")
        if spec_old != spec_new:
            updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if updated == _without(current, "apiVersion", "kind"):
            return self.present(rtype, current)  # a no-op write keeps its resourceVersion
        return self.present(
            rtype, self.store.write(self.storage_key(rtype), updated, change_type="MODIFIED")
        )

    def _admit(self, rtype: ResourceType, obj: Obj, *, old: Obj | None) -> Obj:
        from tests.harness.fake_kube.admission import admit_builtin, metadata_problems

        rtype = self._storage_type(rtype)
        problems = metadata_problems(obj.get("metadata") or {})
        if problems:
            raise errors.invalid(rtype.kind, obj["metadata"]["name"], problems, group=rtype.group)
        crd = self.custom.get(rtype.key)
        unknown: list[str] = []
        if crd is not None:
            admitted, problems = crd.admit(
                {**obj, "apiVersion": rtype.api_version, "kind": rtype.kind}, pruned=unknown
            )
            self._report_unknown_fields(unknown)
            if problems:
                raise errors.invalid(
                    rtype.kind, obj["metadata"]["name"], problems, group=rtype.group
                )
            return _without(admitted, "apiVersion", "kind")
        unknown = drop_unknown_fields(obj, api_version=rtype.api_version, kind=rtype.kind)
        self._report_unknown_fields(unknown)
        decoding, invalid = schema_problems(obj, api_version=rtype.api_version, kind=rtype.kind)
        if decoding:
            raise errors.bad_request("; ".join(decoding))
        if invalid:
            raise errors.invalid(rtype.kind, obj["metadata"]["name"], invalid, group=rtype.group)
        return admit_builtin(self, rtype, obj, old=old)

    def _report_unknown_fields(self, paths: list[str]) -> None:
        """Unknown fields are dropped; `fieldValidation` says whether to warn or refuse."""
        if not paths or self.field_validation == "Ignore":
            return
        if self.field_validation == "Strict":
            raise errors.bad_request(
                "strict decoding error: " + ", ".join(f'unknown field "{path}"' for path in paths)
            )
        self.warnings.extend(f'unknown field "{path}"' for path in paths)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for resource_key, obj in self.store.all_items():
            refs = obj["metadata"].get("ownerReferences") or []
            kept = [ref for ref in refs if ref.get("uid") != owner_uid]
            if len(kept) != len(refs):
                orphan = copy.deepcopy(obj)
                if kept:
                    orphan["metadata"]["ownerReferences"] = kept
                else:
                    orphan["metadata"].pop("ownerReferences")
                self.store.write(resource_key, orphan, change_type="MODIFIED")

    def _delete_namespace_contents(self, namespace: str) -> None:
        for resource_key, obj in self.store.all_items():
            if obj["metadata"].get("namespace") == namespace:
                self.store.delete(resource_key, namespace, obj["metadata"]["name"])
