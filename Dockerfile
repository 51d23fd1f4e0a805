# The image that Beaker (mason.py), Slurm and plain nodes run: this repo at /stage (the working directory, as
# in open-instruct's image) and its locked stack in /opt/venv, first on PATH. docs/image.md says how to build
# each variant and what was verified.
#
#   docker buildx build -t open_instruct .                          GPU, CUDA 13.0 (locks/gpu-cu13.txt)
#   docker buildx build --build-arg CUDA_VERSION=12 -t ... .        GPU, CUDA 12.8 (locks/gpu-cu12.txt)
#   docker buildx build --build-arg STACK=cpu -t ... .              CPU (locks/cpu.txt) on BASE_IMAGE
#
# The variants differ only in the base image and the lock they install: every step below runs on each of
# them, so the CPU build that scripts/image_check.sh runs exercises the same steps as the GPU builds.

ARG CUDA_VERSION=13
ARG STACK=gpu
# The CPU variant's base: any Debian/Ubuntu image with Python >= 3.11 as python3 (Debian bookworm has 3.11).
ARG BASE_IMAGE=debian:bookworm

# The CUDA bases, as arguments so that a registry mirror can stand in for Docker Hub. cuDNN devel images: the
# GPU stack's kernels (flash-attn, triton, DeepSpeed ops) may compile against the CUDA headers at install or
# first use. Ubuntu 24.04 gives Python 3.12 as python3.
ARG CUDA12_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
ARG CUDA13_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04

# One stage per (stack, CUDA version); the last FROM picks one. BuildKit skips the others unpulled; buildah
# 1.28 does not follow an argument in FROM when it skips stages, so image_check.sh builds every stage and
# points the unused CUDA bases at its local base (they are a FROM each, nothing runs in them).
FROM ${CUDA12_IMAGE} AS gpu-cuda12
FROM ${CUDA13_IMAGE} AS gpu-cuda13
FROM ${BASE_IMAGE} AS cpu-cuda12
FROM ${BASE_IMAGE} AS cpu-cuda13
FROM ${STACK}-cuda${CUDA_VERSION}

ARG CUDA_VERSION
ARG STACK
ARG DEBIAN_FRONTEND=noninteractive
ENV TZ=UTC \
    LANG=C.UTF-8

# Python with venv and headers (triton and DeepSpeed compile extensions at first use), a compiler, git (the
# benchmarks stamp their results with it; the image has no .git, so GIT_COMMIT below is the record), and the
# RDMA user space NCCL needs to use InfiniBand from inside a container:
# libibverbs with the mlx5/other providers and librdmacm, which NCCL's IB transport loads at run time; the
# kernel drivers come from the host. ibverbs-utils and infiniband-diags (ibv_devinfo, ibstat) show whether a
# container sees the HCAs. open-instruct installs NVIDIA's DOCA OFED user space for the same purpose; the
# distribution's rdma-core serves NCCL on mlx5 HCAs and installs the same way on every base here. libnuma:
# vLLM's compiled CPU kernels link it (without it the CPU engine fails at start-up, found by image_check.sh).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev \
        build-essential git curl ca-certificates procps libnuma1 \
        libibverbs1 ibverbs-providers librdmacm1 rdma-core ibverbs-utils infiniband-diags \
    && rm -rf /var/lib/apt/lists/*

# The NVIDIA container runtime mounts the driver's libraries that these capabilities name.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility

WORKDIR /stage
COPY . /stage

ENV VIRTUAL_ENV=/opt/venv
ENV PATH=/opt/venv/bin:$PATH

# The stack from the lock, then this repo (editable, so /stage is the code that runs; benchmarks/ is not
# installed and runs from /stage, the working directory, as scripts/gpu_check.sh does). A package index
# other than PyPI reaches pip only as build secrets, never as a layer: `pip_conf` is a pip.conf mounted as
# the global configuration, `pip_ca` a CA bundle (a pip.conf written for the build names it as
# cert = /run/secrets/pip_ca). Either may be left out. The pip cache is a build cache, not a layer.
RUN --mount=type=secret,id=pip_conf,target=/etc/pip.conf \
    --mount=type=secret,id=pip_ca,target=/run/secrets/pip_ca \
    --mount=type=cache,target=/root/.cache/pip \
    set -eu; \
    case "$STACK" in \
        cpu) lock=cpu ;; \
        gpu) lock="gpu-cu$CUDA_VERSION" ;; \
        *) echo "Dockerfile: STACK must be gpu or cpu, not '$STACK'" >&2; exit 1 ;; \
    esac; \
    python3 -m venv "$VIRTUAL_ENV"; \
    PYTHON="$VIRTUAL_ENV/bin/python" bash scripts/install_locked.sh "$lock" --exact

ARG GIT_COMMIT=""
ARG GIT_BRANCH=""
ENV GIT_COMMIT=${GIT_COMMIT} \
    GIT_BRANCH=${GIT_BRANCH}
