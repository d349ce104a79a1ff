# hvd_async for GPU clusters: CUDA + NCCL, OpenMPI, torch (CUDA build), Horovod with NCCL operations.
# The install steps are the project's own scripts/setup.sh, the same one `make test` runs, so the
# image and a developer machine cannot drift apart. (First version; the packaging issue finishes it.)
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    HVD_ASYNC_CACHE=/opt/hvd_async \
    HOROVOD_GPU_OPERATIONS=NCCL \
    PYTHONUNBUFFERED=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev make git libnccl2 libnccl-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/hvd_async/src
COPY . .
RUN bash scripts/setup.sh && .venv/bin/horovodrun --check-build

ENV PATH=/opt/hvd_async/src/.venv/bin:$PATH
CMD ["hvd-async", "train", "--help"]
