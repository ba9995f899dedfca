"""`FakeKube`: the fake API server on 127.0.0.1, its client configuration and test hooks.

async with FakeKube.start() as kube:
    kube.add_node("gpu-0", gpus=8)
    async with kube.api_client() as api:
        await CoreV1Api(api).list_namespaced_pod("default")
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from kubernetes_asyncio import client as k8s_client

from tests.harness.fake_kube.cluster import DEFAULT_NAMESPACES, Cluster
from tests.harness.fake_kube.http_api import KubeHttpApi
from tests.harness.fake_kube.rbac import Access, Rbac
from tests.harness.fake_kube.store import Obj


class FakeKube(Cluster):
    """The cluster state plus an HTTP server that kubernetes-asyncio talks to."""

    def __init__(
        self,
        *,
        history_limit: int = 1000,
        auto_reconcile: bool = True,
        controller_delay_s: float | None = None,
        pod_ready_delay_s: float | None = 0.0,
        pod_termination_scale: float | None = None,
        bookmark_interval_s: float = 1.0,
        watch_timeout_s: float = 1800.0,
        namespaces: tuple[str, ...] = DEFAULT_NAMESPACES,
        clock: Callable[[], Any] | None = None,
        crd_files: tuple[Path, ...] = (),
    ) -> None:
        super().__init__(
            crd_files=crd_files,
            history_limit=history_limit,
            auto_reconcile=auto_reconcile,
            controller_delay_s=controller_delay_s,
            pod_ready_delay_s=pod_ready_delay_s,
            pod_termination_scale=pod_termination_scale,
            namespaces=namespaces,
            clock=clock,
        )
        self.http = KubeHttpApi(
            self, bookmark_interval_s=bookmark_interval_s, watch_timeout_s=watch_timeout_s
        )
        self.url = ""

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, **options: Any) -> AsyncIterator[FakeKube]:
        """Serve on 127.0.0.1 on a free port in the running event loop; stop on exit."""
        kube = cls(**options)
        runner = web.AppRunner(kube.http.app(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        kube.url = f"http://127.0.0.1:{port}"
        try:
            yield kube
        finally:
            kube.store.close_watchers()
            await runner.cleanup()

    # -- clients -------------------------------------------------------------------------

    def client_configuration(self) -> k8s_client.Configuration:
        configuration = k8s_client.Configuration(host=self.url)
        configuration.api_key = {"BearerToken": "fake-token"}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return configuration

    def api_client(self) -> k8s_client.ApiClient:
        """A new kubernetes-asyncio ApiClient for this server (close it, or `async with` it)."""
        return k8s_client.ApiClient(configuration=self.client_configuration())

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig whose current context points at this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- test hooks ----------------------------------------------------------------------

    def accept_only(self, *tokens: str) -> None:
        """Serve only requests bearing one of `tokens` (a rotation: the new one, the old one
        expired); others get 401 Unauthorized. The clients above use "fake-token"."""
        self.http.accepted_tokens = frozenset(tokens)

    def enforce_rbac(self, rbac: Rbac) -> None:
        """Answer 403 Forbidden to every request `rbac`'s rules do not cover, as the API
        server does for a service account bound to those roles."""
        self.http.rbac = rbac

    def denied(self) -> list[Access]:
        """The requests refused for want of a grant since `enforce_rbac`."""
        return [access for access, allowed in self.http.accesses if not allowed]

    def resource(self, name: str) -> Any:
        """A resource type by plural, `plural.group`, kind or short name ("lws", "Pod")."""
        plural, _, group = name.partition(".")
        for rtype in self.registry.all():
            if group and rtype.group != group:
                continue
            if plural in (rtype.plural, rtype.kind, rtype.singular, *rtype.short_names):
                if not group and rtype.plural == "events" and rtype.group:
                    continue  # bare "events" means core/v1 events
                return rtype
        raise KeyError(f"no resource type {name!r}")

    def objects(
        self, resource: str, namespace: str | None = None, *, label_selector: str | None = None
    ) -> list[Obj]:
        """Copies of the stored objects of one type, e.g. `kube.objects("pods", "default")`."""
        return self.list_objects(self.resource(resource), namespace, label_selector=label_selector)

    def object(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        return self.find(self.resource(resource), namespace, name)

    def apply(self, manifest: Obj, *, namespace: str | None = None) -> Obj:
        """Create an object from a manifest dict (no HTTP), with full admission."""
        rtype = self.registry.by_kind(manifest.get("apiVersion", ""), manifest.get("kind", ""))
        if rtype is None:
            raise KeyError(f"unknown kind {manifest.get('apiVersion')}/{manifest.get('kind')}")
        namespace = (
            namespace
            or manifest.get("metadata", {}).get("namespace")
            or ("default" if rtype.namespaced else None)
        )
        return self.create(rtype, namespace, manifest)

    def apply_file(self, path: Path, *, namespace: str | None = None) -> list[Obj]:
        """Create every object of a (multi-document) YAML manifest file, in order."""
        with path.open() as handle:
            documents = [doc for doc in yaml.safe_load_all(handle) if doc]
        return [self.apply(doc, namespace=namespace) for doc in documents]

    def add_namespace(self, name: str) -> Obj:
        return self.create(self.resource("namespaces"), None, {"metadata": {"name": name}})

    def add_priority_class(
        self,
        name: str,
        value: int,
        *,
        global_default: bool = False,
        preemption_policy: str = "PreemptLowerPriority",
    ) -> Obj:
        return self.create(
            self.resource("priorityclasses"),
            None,
            {
                "metadata": {"name": name},
                "value": value,
                "globalDefault": global_default,
                "preemptionPolicy": preemption_policy,
            },
        )

    def add_node(
        self,
        name: str,
        *,
        cpu: str = "64",
        memory: str = "512Gi",
        gpus: int = 0,
        pods: int = 110,
        extended: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        taints: list[Obj] | None = None,
        unschedulable: bool = False,
        ready: bool = True,
    ) -> Obj:
        """Register a node with these allocatable resources, as a kubelet would."""
        allocatable = {"cpu": cpu, "memory": memory, "pods": str(pods), **(extended or {})}
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        node_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            **(labels or {}),
        }
        nodes = self.resource("nodes")
        spec: Obj = {}
        if taints:
            spec["taints"] = taints
        if unschedulable:
            spec["unschedulable"] = True
        created = self.create(
            nodes,
            None,
            {"metadata": {"name": name, "labels": node_labels}, "spec": spec},
            reconcile=False,
        )
        index = len(self.store.items(nodes.key))
        created["status"] = {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "lastTransitionTime": self.now_text(),
                    "lastHeartbeatTime": self.now_text(),
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{index // 250}.{index % 250}"},
                {"type": "Hostname", "address": name},
            ],
        }
        result = self.write_internal(nodes, created)
        self.after_write()
        return result

    def set_node_ready(self, name: str, *, ready: bool) -> Obj:
        nodes = self.resource("nodes")
        node = self.get(nodes, None, name)
        for condition in node["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition["status"] = "True" if ready else "False"
        result = self.write_internal(nodes, node)
        self.after_write()
        return result

    def remove(self, resource: str, namespace: str | None, name: str) -> Obj:
        """Delete an object as a controller or an operator would (no HTTP)."""
        return self.delete(self.resource(resource), namespace, name)

    def expire_watches(self) -> None:
        """End every open watch stream, as an API server restart does."""
        self.store.close_watchers()

    def compact(self) -> None:
        """Forget the change history: resuming a watch from before now gets 410 Gone."""
        self.store.compact()

    def requests(
        self, method: str | None = None, path_contains: str = ""
    ) -> list[tuple[str, str, str]]:
        """The requests served so far: (method, path with query, Content-Type)."""
        return [
            r
            for r in self.request_log
            if (method is None or r[0] == method) and path_contains in r[1]
        ]
