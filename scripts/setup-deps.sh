#!/usr/bin/env bash
# Installs every Debian package monarch-cpp needs to build, test, benchmark and run its demo.
# This is the one list of system dependencies; each layer adds its packages here.
# Idempotent: runs `apt-get update` only when a package is missing. Must run as root (or via sudo).
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev clang-format
  # tests and benchmarks
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  # SLURM launcher: slurm-local.sh runs a single-node cluster for its end-to-end test
  slurm-wlm
  # runtime libraries (what each layer links: docs/design.md, "Layers")
  libspdlog-dev libfmt-dev libasio-dev libcereal-dev libcli11-dev nlohmann-json3-dev libssl-dev
  # data plane (monarch_rdma ucx backend) and its benchmark peer ucx_perftest
  libucx-dev ucx-utils
  # benchmark peer: C++ Actor Framework 0.17
  libcaf-dev
  # fault-tolerant training (monarch_ft_torch, examples/ft_train): libtorch with c10d gloo, its
  # gloo headers, the data, the chart. libopenblas0-openmp replaces the reference BLAS that
  # libtorch pulls in (about 35x faster matrix multiply: 32 ms -> 2.3 ms per training step).
  libtorch-dev libgloo-dev zlib1g-dev dataset-fashion-mnist gnuplot-nox libopenblas0-openmp
  # ft_train --model llama-tiny trains on English text: Debian's fortune cookie files
  fortunes fortunes-min
  # the standalone lighthouse's HTTP status page and JSON API; its page is tested in headless
  # chromium
  libcpp-httplib-dev chromium
  # scripts (python3 also runs scripts/fake-kube-api.py for the Kubernetes launcher's tests)
  python3
  # Python front end (src/python, python/monarch): the bindings (pybind11) for Debian's
  # /usr/bin/python3, cloudpickle for messages, torch (1.13.1, the same build as libtorch-dev) and
  # numpy for tensors, pytest for python/tests
  python3-dev pybind11-dev python3-pybind11 python3-cloudpickle python3-torch python3-numpy
  python3-pytest
)
# kubectl for the Kubernetes launcher and its tests. Only when none is on PATH: another kubectl
# (e.g. google-cloud-cli's) conflicts with Debian's on /usr/bin/kubectl.
if ! command -v kubectl >/dev/null 2>&1; then
  PACKAGES+=(kubernetes-client)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup-deps: missing packages (${missing[*]}) and not root; rerun as root" >&2
    exit 1
  fi
fi

echo "setup-deps: installing ${#missing[@]} missing package(s): ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup-deps: done"
