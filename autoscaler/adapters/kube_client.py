"""The Kubernetes API client, configured once at start (DESIGN section 8: `--kubeconfig`).

Order: an explicit kubeconfig path; else the in-cluster service account (when the pod's
`KUBERNETES_SERVICE_HOST` is set); else `$KUBECONFIG` or `~/.kube/config`.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from autoscaler.adapters.kube_errors import KubeConfigError


async def new_api_client(*, kubeconfig: Path | None = None) -> client.ApiClient:
    """An ApiClient for the cluster; raises KubeConfigError naming what was tried."""
    tried: list[str] = []
    if kubeconfig is not None:
        if not kubeconfig.exists():
            raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
        try:
            return await config.new_client_from_config(config_file=str(kubeconfig))
        except (ConfigException, OSError, ValueError) as err:
            raise KubeConfigError(f"kubeconfig {kubeconfig}: {err}") from err
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration=configuration)
        except ConfigException as err:
            tried.append(f"in-cluster: {err}")
    else:
        tried.append("in-cluster: KUBERNETES_SERVICE_HOST is not set")
    default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    # KUBECONFIG may list several files; the client reads the first, as kubectl's default does.
    first = default.split(os.pathsep)[0]
    if Path(first).exists():
        try:
            return await config.new_client_from_config(config_file=first)
        except (ConfigException, OSError, ValueError) as err:
            tried.append(f"{first}: {err}")
    else:
        tried.append(f"{first}: no such file")
    raise KubeConfigError("no Kubernetes configuration found (" + "; ".join(tried) + ")")
