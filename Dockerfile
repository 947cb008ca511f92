# syntax=docker/dockerfile:1
# One image for the operator and the node agent: `tessera operator`, `tessera agent`.
#   docker build -t ghcr.io/tessera-dev/tessera:0.1.0 .   (the registry is a placeholder)
# Stage 1 builds a wheel of Tessera and wheels of its pinned dependencies; stage 2 installs
# them into a slim Python with no compiler, no pip cache, and a non-root default user.

FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml requirements.lock README.md ./
COPY operator/src ./operator/src
# The lock pins every runtime dependency; the dev tools in it are not installed (-c only constrains).
RUN python -m pip wheel --wheel-dir /wheels -c requirements.lock .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.description="Share GPUs on Kubernetes: MIG, time-slicing and MPS through DRA" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links /wheels tessera \
    && python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# iproute2's `tc`: the agent writes shared NICs' MAC filters with it (tessera.agent.nics.shaping).
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*
# Non-root by default (distroless's "nonroot" uid). The agent DaemonSet runs as root on purpose
# (host folders of the kubelet; NVML), see manifests/agent.yaml. The uid needs a passwd entry:
# Kopf names its peering identity after the user (getpass.getuser()), which fails without one.
RUN groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
USER 65532:65532
ENTRYPOINT ["tessera"]
CMD ["--help"]
