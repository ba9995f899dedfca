"""Emulation of the DisaggregatedSet controller's scaling side (kubernetes-sigs/lws v0.10).

What it does, as `pkg/controllers/disaggregatedset/scaler_manager.go` and `replicas.go` do:
- for every role with `scaling.mode: External`, keeps a DisaggregatedSetRoleScaler named
  `<set>-<role>`, labelled with the set and role and controlled by the set; a new one starts
  at the role's current LWS count (a Static-to-External flip), or 1;
- deletes the RoleScalers the set controls whose role is no longer External;
- drives the role's LWS `spec.replicas` from the RoleScaler's `spec.replicas`;
- writes the RoleScaler's `status.replicas` (the role's groups) and `status.selector`.

Simplifications: it does not create the roles' LWS objects (a test creates them with the
labels and controller reference the real controller sets: `role_lws`), and it drives a
role's count only while the role has exactly one LWS: a rollout's or several slices' split
of the count is the real planner's, and the autoscaler holds such a role anyway. Register it with
`cluster.add_controller(reconcile_disaggregatedsets)`.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from tests.harness.fake_kube.errors import ApiError

if TYPE_CHECKING:
    from tests.harness.fake_kube.cluster import Cluster

GROUP = "disaggregatedset.x-k8s.io"
SET_KEY = f"{GROUP}/disaggregatedsets"
SCALER_KEY = f"{GROUP}/disaggregatedsetrolescalers"
LWS_KEY = "leaderworkerset.x-k8s.io/leaderworkersets"
NAME_LABEL = f"{GROUP}/name"
ROLE_LABEL = f"{GROUP}/role"

Obj = dict[str, Any]


def _controlled_by(obj: Obj, owner: Obj) -> bool:
    uid = owner["metadata"]["uid"]
    return any(
        ref.get("controller") is True and ref.get("uid") == uid
        for ref in obj["metadata"].get("ownerReferences") or []
    )


def reconcile_disaggregatedsets(cluster: Cluster) -> None:
    for ds in list(cluster.store.items(SET_KEY)):
        _reconcile_one(cluster, ds)


def _role_lws(cluster: Cluster, ds: Obj, role: str) -> list[Obj]:
    namespace = ds["metadata"]["namespace"]
    return [
        lws
        for lws in cluster.store.items(LWS_KEY, namespace)
        if (lws["metadata"].get("labels") or {}).get(NAME_LABEL) == ds["metadata"]["name"]
        and (lws["metadata"].get("labels") or {}).get(ROLE_LABEL) == role
        and _controlled_by(lws, ds)
        and not lws["metadata"].get("deletionTimestamp")
    ]


def _reconcile_one(cluster: Cluster, ds: Obj) -> None:
    scalers_type = cluster.rtype(GROUP, "disaggregatedsetrolescalers")
    lws_type = cluster.rtype("leaderworkerset.x-k8s.io", "leaderworkersets")
    namespace, ds_name = ds["metadata"]["namespace"], ds["metadata"]["name"]
    external = {
        role["name"]
        for role in ds["spec"].get("roles") or []
        if (role.get("scaling") or {}).get("mode") == "External"
    }
    for scaler in list(cluster.store.items(SCALER_KEY, namespace)):
        role = (scaler["metadata"].get("labels") or {}).get(ROLE_LABEL)
        if _controlled_by(scaler, ds) and role not in external:
            cluster.delete(scalers_type, namespace, scaler["metadata"]["name"], reconcile=False)
    for role in sorted(external):
        children = _role_lws(cluster, ds, role)
        scaler = cluster.find(scalers_type, namespace, f"{ds_name}-{role}")
        if scaler is None:
            seed = int(children[0]["spec"].get("replicas", 1)) if children else 1
            scaler = cluster.create(
                scalers_type,
                namespace,
                {
                    "apiVersion": f"{GROUP}/v1",
                    "kind": "DisaggregatedSetRoleScaler",
                    "metadata": {
                        "name": f"{ds_name}-{role}",
                        "labels": {NAME_LABEL: ds_name, ROLE_LABEL: role},
                        "ownerReferences": [
                            {
                                "apiVersion": f"{GROUP}/v1",
                                "kind": "DisaggregatedSet",
                                "name": ds_name,
                                "uid": ds["metadata"]["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": {"replicas": seed},
                },
                reconcile=False,
            )
        if not _controlled_by(scaler, ds):
            continue  # the real controller refuses to adopt it, and so drives nothing
        wanted = int(scaler["spec"].get("replicas", 0))
        if len(children) == 1 and int(children[0]["spec"].get("replicas", 1)) != wanted:
            child = copy.deepcopy(children[0])
            child["spec"]["replicas"] = wanted
            try:
                cluster.write_internal(lws_type, child)
            except ApiError:
                continue  # deleted meanwhile; the next pass sees it gone
        groups = sum(int((c.get("status") or {}).get("replicas") or 0) for c in children)
        status = {"replicas": groups, "selector": f"{NAME_LABEL}={ds_name},{ROLE_LABEL}={role}"}
        if (scaler.get("status") or {}) != status:
            updated = copy.deepcopy(scaler)
            updated["status"] = status
            cluster.write_internal(scalers_type, updated)


def role_lws(lws: Obj, *, ds: Obj, role: str, revision: str = "6f9c") -> Obj:
    """`lws` as the DisaggregatedSet controller makes it for `role` of `ds` (the stored set):
    the set's labels and the set as controller. The real name also carries the slice and the
    revision (`<set>-<slice>-<revision>-<role>`); the autoscaler reads labels and owners."""
    made = copy.deepcopy(lws)
    made["metadata"]["labels"] = {
        **(made["metadata"].get("labels") or {}),
        NAME_LABEL: ds["metadata"]["name"],
        ROLE_LABEL: role,
        f"{GROUP}/revision": revision,
        f"{GROUP}/slice": "0",
    }
    made["metadata"]["ownerReferences"] = [
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "DisaggregatedSet",
            "name": ds["metadata"]["name"],
            "uid": ds["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return made
