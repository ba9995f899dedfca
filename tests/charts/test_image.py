"""The Dockerfile agrees with the chart: same uid, the CLI as entry point, slim and staged.

(No Docker daemon runs in CI, so the image itself is not built here.)
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.charts.conftest import CHART_DIR, REPO, one

DOCKERFILE = (REPO / "Dockerfile").read_text(encoding="utf-8")


def final_stage() -> str:
    stages = re.split(r"^FROM ", DOCKERFILE, flags=re.M)
    assert len(stages) >= 3, "the image must be multi-stage"
    return stages[-1]


def test_final_stage_is_slim_and_has_no_build_tools() -> None:
    final = final_stage()
    assert re.match(r"python:\$\{PYTHON_VERSION\}-slim", final)
    for tool in ("apt-get install", "gcc", "build-essential", "pip install"):
        assert tool not in final, tool
    assert "COPY --from=build /opt/venv /opt/venv" in final


def test_image_runs_as_the_chart_uid_and_entry_point(rendered: list[dict[str, Any]]) -> None:
    user = re.search(r"^USER (\d+):(\d+)$", final_stage(), flags=re.M)
    assert user, "the final stage must set a numeric non-root USER"
    uid, gid = int(user.group(1)), int(user.group(2))
    assert uid != 0 and gid != 0
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == uid
    assert pod["securityContext"]["runAsGroup"] == gid
    assert 'ENTRYPOINT ["gang-autoscaler"]' in final_stage()
    (container,) = pod["containers"]
    assert "command" not in container  # the args go to the entry point
    port = int(re.search(r"^EXPOSE (\d+)$", final_stage(), flags=re.M).group(1))  # type: ignore[union-attr]
    assert port == yaml.safe_load((CHART_DIR / "values.yaml").read_text())["httpPort"]


def test_python_version_matches_the_package() -> None:
    version = re.search(r"^ARG PYTHON_VERSION=(\d+\.\d+)$", DOCKERFILE, flags=re.M)
    assert version
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    required = re.search(r'requires-python = ">=(\d+\.\d+)"', pyproject)
    assert required and version.group(1) == required.group(1)
