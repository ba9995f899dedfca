"""A realistic fake Kubernetes API server for tests (see docs/testing-kubernetes.md).

kubernetes-asyncio talks to it over HTTP exactly as to a real API server; tests arrange
scenarios through `FakeKube`'s hooks.
"""

from tests.harness.fake_kube.errors import ApiError
from tests.harness.fake_kube.lws_controller import hpa_pod_selector
from tests.harness.fake_kube.server import FakeKube

__all__ = ["ApiError", "FakeKube", "hpa_pod_selector"]
