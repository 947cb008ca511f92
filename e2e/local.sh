#!/usr/bin/env bash
# Tessera's install without Docker: the image built by buildah from the Dockerfile, one real
# local node (kubelet + containerd + runc), manifests/install.yaml, simulated GPUs chosen by
# e2e/local/simulated-agent.yaml, and the sample policies and workloads. Needs root and
# Debian's runc, containernetworking-plugins, busybox-static, buildah and mmdebstrap.
#   e2e/local.sh          keep running (prints how to reach the cluster)
#   e2e/local.sh --exit   stop once the samples run
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap
exec .venv/bin/python e2e/local.py "$@"
