"""The Kubernetes API client, configured once at start (DESIGN section 8: `--kubeconfig`).

Order: an explicit kubeconfig path; else the in-cluster service account (when the pod's
`KUBERNETES_SERVICE_HOST` is set); else `$KUBECONFIG` or `~/.kube/config`.

The credential stays current for as long as the service runs. In-cluster, kubernetes-asyncio
re-reads the projected ServiceAccount token file at the first request a minute after its
last read (its `refresh_api_key_hook`), so a token the kubelet rotated is picked up long
before the old one expires. From a kubeconfig the library reads the credential once; the
hook installed here asks the library's loader again at most once a minute, and the loader
renews what is due by its own rules: an exec plugin (EKS, GKE) or GCP/OIDC token within
5 minutes of its expiry, a `tokenFile` every time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.kube_config import KubeConfigLoader

from autoscaler.adapters.kube_errors import KubeConfigError

log = logging.getLogger(__name__)

# kubernetes-asyncio indexes into the parsed file without checking its shape, so a wrong
# type somewhere inside (`contexts: 5`, a user that is a string) surfaces as one of these.
_MALFORMED = (TypeError, AttributeError, KeyError)

# As the library's in-cluster loader and its `config.refresh_token` loop: well inside the
# 5 minutes before expiry in which the loader renews an exec plugin's or OIDC/GCP token.
CREDENTIAL_CHECK_INTERVAL_S = 60.0

# A healthy API server answers one read or write in milliseconds. kubernetes-asyncio sets no
# timeout of its own, so without one a call the server never answers (an overloaded
# apiserver, a peer gone without a reset) holds its component's writes until the tick's
# deadline abandons the whole tick.
DEFAULT_REQUEST_TIMEOUT_S = 5.0


class TimedApi:
    """A kubernetes-asyncio API object (`CoreV1Api`, `CustomObjectsApi`, ...) whose every
    call carries a request timeout; a call that runs past it raises `TimeoutError`, which
    callers treat as no answer (the write may have landed)."""

    def __init__(self, api: Any, *, timeout_s: float) -> None:
        self._api = api
        self._timeout_s = timeout_s

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._api, name)
        if not callable(value):
            return value  # e.g. `api_client`
        return functools.partial(value, _request_timeout=self._timeout_s)


async def new_api_client(
    *, kubeconfig: Path | None = None, clock: Callable[[], float] = time.monotonic
) -> client.ApiClient:
    """An ApiClient for the cluster; raises KubeConfigError naming what was tried.

    `clock` (monotonic seconds) times the checks of a kubeconfig credential."""
    tried: list[str] = []
    if kubeconfig is not None:
        if not kubeconfig.exists():
            raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
        try:
            return await _client_from_file(kubeconfig, clock=clock)
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
            return await _client_from_file(first, clock=clock)
        except KubeConfigError as err:
            tried.append(f"{first}: {err}")
    else:
        tried.append(f"{first}: no such file")
    raise KubeConfigError("no Kubernetes configuration found (" + "; ".join(tried) + ")")


async def _client_from_file(path: Path, *, clock: Callable[[], float]) -> client.ApiClient:
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
        configuration = client.Configuration()
        loader = await config.load_kube_config(
            config_file=str(path), client_configuration=configuration, persist_config=False
        )
    except (ConfigException, OSError, ValueError) as err:
        raise KubeConfigError(str(err)) from err
    except _MALFORMED as err:
        raise KubeConfigError(f"not a valid kubeconfig ({type(err).__name__}: {err})") from err
    if configuration.api_key.get("BearerToken"):
        # Client certificates need no hook: they go into the TLS context once, at the start.
        configuration.refresh_api_key_hook = _KubeconfigCredential(loader, clock=clock)
    return client.ApiClient(configuration=configuration)


class _KubeconfigCredential:
    """The `refresh_api_key_hook` of a client loaded from a kubeconfig: before a request,
    once a check is due, the library's loader renews the token if it must.

    The library offers two ways to renew a kubeconfig credential; this is the one its
    in-cluster loader and the official Python client's kubeconfig loader use. The other,
    `config.refresh_token(loader, configuration)`, is a loop the caller must keep running
    that renews exec plugin and GCP tokens only (not OIDC, not a `tokenFile`), fails with a
    TypeError on a context without a user, and ends for good at the first error.
    """

    def __init__(self, loader: KubeConfigLoader, *, clock: Callable[[], float]) -> None:
        self._loader = loader
        self._clock = clock
        self._checked_s = clock()
        self._lock = asyncio.Lock()  # concurrent requests run an exec plugin once, not each

    async def __call__(self, configuration: client.Configuration) -> None:
        if self._clock() - self._checked_s < CREDENTIAL_CHECK_INTERVAL_S:
            return
        async with self._lock:
            if self._clock() - self._checked_s < CREDENTIAL_CHECK_INTERVAL_S:
                return  # renewed while this request waited
            try:
                # The loader's one entry for every kind of user (what load_kube_config ran),
                # each with its own cache: an unexpired exec or OIDC token is not fetched again.
                await self._loader._load_authentication()
            except Exception as err:  # a plugin's, an issuer's or a file's: any of them
                # The request goes on with the credential it has. If the API server refuses
                # it, the 401 fails that call like any API error, and the next check retries.
                log.warning(
                    "renewing the Kubernetes credential failed (%s); keeping the current one "
                    "and trying again in %gs",
                    " ".join(str(err).split()) or type(err).__name__,
                    CREDENTIAL_CHECK_INTERVAL_S,
                )
            else:
                configuration.api_key["BearerToken"] = self._loader.token
            self._checked_s = self._clock()


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line, with the line and column it stopped at."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"{err.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(err).split())
