#!/usr/bin/env bash
# Tessera on kind, for people with Docker: create a cluster, build and load the image,
# install manifests/install.yaml, and run the sample policies and workloads.
#
#   e2e/run.sh               simulated GPUs (no GPU needed): 1 x H100-80GB + 1 x H200 per worker
#   e2e/run.sh --gpu         real GPUs through NVML, on a GPU-enabled kind cluster you made
#                            (e.g. with NVIDIA's nvkind) and name with --name
#   e2e/run.sh --delete      delete the cluster
#
# Options: --name NAME (default tessera), --simulate SPEC (default 1xH100-80GB,1xH200-141GB),
# --no-build (use an image already loaded). Env: KIND_NODE_IMAGE, IMAGE.
set -euo pipefail
cd "$(dirname "$0")/.."

name=tessera
mode=simulated
simulate=1xH100-80GB,1xH200-141GB
build=1
image=${IMAGE:-ghcr.io/tessera-dev/tessera:0.1.0}  # placeholder registry; loaded into kind, never pulled
demo_ns=tessera-demo

while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) mode=nvml ;;
    --name) name=$2; shift ;;
    --simulate) simulate=$2; shift ;;
    --no-build) build=0 ;;
    --delete) kind delete cluster --name "$name"; exit 0 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
need() { command -v "$1" >/dev/null || { echo "e2e/run.sh needs $1 on PATH" >&2; exit 1; }; }
need docker; need kind; need kubectl

ctx="kind-$name"
k() { kubectl --context "$ctx" "$@"; }

if [ "$mode" = simulated ]; then
  if kind get clusters | grep -qx "$name"; then
    say "using the existing kind cluster $name"
  else
    say "creating kind cluster $name"
    config=e2e/kind.yaml
    if [ -n "${KIND_NODE_IMAGE:-}" ]; then
      config=$(mktemp); sed "s#kindest/node:[^ ]*#$KIND_NODE_IMAGE#" e2e/kind.yaml > "$config"
    fi
    kind create cluster --name "$name" --config "$config"
  fi
else
  kind get clusters | grep -qx "$name" || {
    echo "--gpu needs a GPU-enabled kind cluster called $name (make one with NVIDIA's nvkind; see e2e/README.md)" >&2
    exit 1
  }
fi

if [ "$build" = 1 ]; then
  say "building $image"
  docker build -t "$image" .
fi
say "loading $image into kind"
kind load docker-image "$image" --name "$name"

say "installing Tessera (manifests/install.yaml)"
k apply -f manifests/install.yaml
k wait --for condition=Established crd/sharingpolicies.tessera.dev crd/nodelayouts.tessera.dev --timeout=60s

workers=$(k get nodes -o name | grep -v control-plane || true)
if [ "$mode" = simulated ]; then
  say "simulated GPUs ($simulate) on every worker"
  for node in $workers; do k label --overwrite "$node" nvidia.com/gpu.present=true; done
  # The switch of manifests/agent.yaml; privileges stay as shipped (harmless without GPUs).
  k -n tessera-system set env daemonset/tessera-agent TESSERA_BACKEND=simulated "TESSERA_SIMULATE=$simulate" \
    TESSERA_SIMULATED_DEV_DIR=/var/lib/tessera/dev
else
  say "real GPUs through NVML on nodes labelled nvidia.com/gpu.present=true"
  k get nodes -l nvidia.com/gpu.present=true -o name | grep -q . || {
    echo "no node is labelled nvidia.com/gpu.present=true: install NVIDIA's GPU feature discovery or label GPU nodes" >&2
    exit 1
  }
  k -n tessera-system set env daemonset/tessera-agent TESSERA_BACKEND=nvml TESSERA_SIMULATE- TESSERA_SIMULATED_DEV_DIR-
fi

say "waiting for the operator and the agents"
k -n tessera-system rollout status deployment/tessera-operator --timeout=180s
k -n tessera-system rollout status daemonset/tessera-agent --timeout=180s

say "sample policies and workloads (namespace $demo_ns)"
k apply -f manifests/samples/sharingpolicies.yaml
k create namespace "$demo_ns" --dry-run=client -o yaml | k apply -f -
for sample in manifests/samples/inference-mig-3g.yaml manifests/samples/inference-shared-10gi.yaml; do
  if [ "$mode" = simulated ]; then
    # Simulated GPUs cannot run vLLM: same claims, a container that only sleeps.
    sed -e 's#image: vllm/vllm-openai:.*#image: registry.k8s.io/pause:3.10#' -e '/^      args:/d' "$sample" \
      | k apply -n "$demo_ns" -f -
  else
    k apply -n "$demo_ns" -f "$sample"
  fi
done

say "waiting for the claims to be allocated"
for pod in vllm-mig-3g vllm-shared-10gi; do
  k -n "$demo_ns" wait --for=condition=PodScheduled "pod/$pod" --timeout=180s
done

say "what Tessera made"
k get sharingpolicies
k get nodelayouts
k get resourceslices -o wide
k -n "$demo_ns" get resourceclaims -o wide
k -n "$demo_ns" get pods -o wide
echo
echo "kubectl --context $ctx ... to look further; e2e/run.sh --delete --name $name to remove the cluster."
