"""The Kubernetes API client, configured once at start (DESIGN section 8: `--kubeconfig`).

Order: an explicit kubeconfig path; else the in-cluster service account (when the pod's
`KUBERNETES_SERVICE_HOST` is set); else `$KUBECONFIG` or `~/.kube/config`.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from autoscaler.adapters.kube_errors import KubeConfigError

# kubernetes-asyncio indexes into the parsed file without checking its shape, so a wrong
# type somewhere inside (`contexts: 5`, a user that is a string) surfaces as one of these.
_MALFORMED = (TypeError, AttributeError, KeyError)


async def new_api_client(*, kubeconfig: Path | None = None) -> client.ApiClient:
    """An ApiClient for the cluster; raises KubeConfigError naming what was tried."""
    tried: list[str] = []
    if kubeconfig is not None:
        if not kubeconfig.exists():
            raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
        try:
            return await _client_from_file(kubeconfig)
        except KubeConfigError as err:
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
    # KUBECONFIG may list several files. kubectl merges them (the first file to set a value
    # wins); this reads only the first. kubernetes-asyncio can merge, but lets the last
    # file's current-context win, so its merge would pick a different cluster than kubectl
    # does for the same list: one file, used as it is, is the predictable choice.
    first = Path(default.split(os.pathsep)[0])
    if first.exists():
        try:
            return await _client_from_file(first)
        except KubeConfigError as err:
            tried.append(f"{first}: {err}")
    else:
        tried.append(f"{first}: no such file")
    raise KubeConfigError("no Kubernetes configuration found (" + "; ".join(tried) + ")")


async def _client_from_file(path: Path) -> client.ApiClient:
    """A client from one kubeconfig file; KubeConfigError says in one line what is wrong."""
    # The file is parsed here first so that an empty file, broken YAML or a document that is
    # not a mapping is said in plain words rather than as the client's TypeError.
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: UnicodeDecodeError
        raise KubeConfigError(f"cannot read: {err}") from err
    except yaml.YAMLError as err:
        raise KubeConfigError(f"not valid YAML: {_yaml_problem(err)}") from err
    if document is None:
        raise KubeConfigError("the file is empty")
    if not isinstance(document, dict):
        raise KubeConfigError(
            f"not a kubeconfig: the top level is a {type(document).__name__}, not a mapping"
        )
    try:
        # persist_config=False: the service never writes the kubeconfig. With the default,
        # a token refreshed while loading (an OIDC or GCP auth-provider whose token expired)
        # is written back into the file, which would fail on a read-only mount (a Secret or
        # ConfigMap volume always is) and otherwise rewrite the operator's file, comments
        # lost. In kubernetes-asyncio 36 the write does not even happen: its persister is
        # called with an argument it does not take, and the TypeError stops the start.
        return await config.new_client_from_config(config_file=str(path), persist_config=False)
    except (ConfigException, OSError, ValueError) as err:
        raise KubeConfigError(str(err)) from err
    except _MALFORMED as err:
        raise KubeConfigError(f"not a valid kubeconfig ({type(err).__name__}: {err})") from err


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line, with the line and column it stopped at."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"{err.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(err).split())
