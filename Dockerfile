# syntax=docker/dockerfile:1
# The gang-autoscaler image: `docker build -t gang-autoscaler .`
#
# Two stages: the first installs the package and its wheels into a virtualenv, the second
# copies only that virtualenv onto a clean slim Python, so no pip cache, sources or build
# tooling reach the final image. Every runtime dependency ships manylinux wheels (numpy,
# pandas, scipy, statsmodels), so no compiler is needed in either stage.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first, so a source change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p autoscaler forecasting \
    && touch autoscaler/__init__.py forecasting/__init__.py \
    && pip install . \
    && pip uninstall -y gang-autoscaler
COPY autoscaler ./autoscaler
COPY forecasting ./forecasting
RUN pip install --no-deps . \
    && python -m compileall -q /opt/venv \
    && pip uninstall -y pip setuptools wheel

FROM python:${PYTHON_VERSION}-slim-bookworm
# The base image's own pip and setuptools are not needed at run time either.
RUN python -m pip uninstall -y pip setuptools wheel \
    && groupadd --gid 65532 autoscaler \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin autoscaler
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OPENBLAS_NUM_THREADS=1 \
    MPLCONFIGDIR=/tmp
# Numeric, so Kubernetes' runAsNonRoot can verify it; the chart runs as the same uid.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["gang-autoscaler"]
CMD ["run", "--help"]
