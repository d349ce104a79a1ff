# hvd_async for GPU clusters: CUDA + NCCL, OpenMPI, the CUDA build of torch and its torchvision,
# mpi4py, tensorboard, Horovod with NCCL GPU operations and both MPI and Gloo controllers.
#
# The install is the project's own scripts/setup.sh, the script `make setup` (and so `make train`
# and `make test`, the README's commands) runs: the image and a developer machine cannot drift.
# tests/test_packaging.py checks that, and lints this file with hadolint (.hadolint.yaml).
#
#   docker build -t hvd_async .
#   docker run --gpus all --ipc=host hvd_async hvd-async train --np 2 --epochs 2 --device auto
#   docker run --gpus all --ipc=host hvd_async hvd-async doctor      # what a job needs, checked
#
# CUDA: CUDA_VERSION (default 13.0.0, the CUDA of the torch wheel scripts/requirements.txt pins, which
# tests/test_packaging.py checks; it needs NVIDIA driver R580 or newer). For an older driver build
# with its CUDA and a torch built for it, e.g. (driver R570):
#   docker build --build-arg CUDA_VERSION=12.8.1 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t hvd_async:cu128 .
#
# MPI: Ubuntu 24.04's Open MPI 4.1 (openmpi-bin), with the PMIx and UCX it is built against (Ubuntu's
# libpmix2 and libucx0); the build writes what it got to /opt/hvd_async/mpi-stack.txt (`ompi_info`'s
# Open MPI, pmix, pml and osc lines) and fails without Open MPI's osc ucx, which windows across
# nodes need. UCX takes InfiniBand where the container sees /dev/infiniband (`ucx_info -d` inside
# lists the devices); otherwise TCP. Slurm: launch with `srun --mpi=pmix`, whose PMIx server
# (the host's Slurm plugin) speaks to the image's PMIx client across PMIx versions 3 and later.
#   pyxis/enroot:  srun --mpi=pmix --container-image=REGISTRY#hvd_async:latest --container-mounts=/data:/data \
#                    python -m hvd_async.job.train --np "$SLURM_NTASKS" --device auto ...
#   Apptainer:     apptainer build hvd_async.sif docker-daemon://hvd_async:latest
#                  PROGRAM="apptainer exec --nv hvd_async.sif python -m hvd_async.job.train --np 8 --device auto" \
#                    NODES=2 GPUS_PER_NODE=4 launch/slurm.sbatch --config dc-asgd
#   (an srun that lists no pmix in `srun --mpi=list`: mpirun inside the allocation, launch/mpirun.sh)
#
# --ipc=host (or --shm-size=16g where the host's IPC namespace is not to be shared): Docker gives a
# container 64 MB of /dev/shm, and NCCL's shared-memory transport, UCX between the ranks (the
# servers' windows) and torch's DataLoader workers need more (NCCL crashes in ncclShmOpen or with a
# bus error when it runs out).
# `hvd-async train` trains on the CPU unless told: --device auto (or cuda) takes the GPUs.
#
# Runs as the non-root user `hvd` (uid 1001; numeric, so Kubernetes' runAsNonRoot can check it). Clusters that start containers as the submitting user
# (Slurm with enroot/pyxis or Apptainer) override it anyway; where a cluster needs root inside the
# container, run with --user 0; Kubeflow's MPIJob needs sshd, which
# the image configures for a non-root user (launch/kubeflow-mpijob.yaml).
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04

# (empty: PyPI's torch, built for the default CUDA_VERSION)
ARG TORCH_INDEX_URL=""

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# HOROVOD_GPU_OPERATIONS=NCCL: scripts/build_horovod.sh builds Horovod's GPU collectives on NCCL
# (it always builds with HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_PYTORCH=1).
ENV DEBIAN_FRONTEND=noninteractive \
    HVD_ASYNC_CACHE=/opt/hvd_async \
    HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_WITH_MPI=1 \
    HOROVOD_WITH_GLOO=1 \
    CUDA_HOME=/usr/local/cuda \
    PYTHONUNBUFFERED=1

# What setup.sh expects to find (Python, venv, NCCL from the CUDA repository) and what an MPIJob
# needs (ssh). OpenMPI, cmake and the compilers are installed by setup.sh itself.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev git ca-certificates libnccl2 libnccl-dev \
      openssh-client openssh-server \
 && rm -rf /var/lib/apt/lists/*

# Only what the install needs first, so that edits to tests or docs do not rebuild Horovod.
WORKDIR /opt/hvd_async/src
COPY pyproject.toml setup.cfg README.md ./
COPY scripts/ scripts/
COPY hvd_async/ hvd_async/
RUN if [ -n "$TORCH_INDEX_URL" ]; then export PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL"; fi \
 && bash scripts/setup.sh \
 && rm -rf /var/lib/apt/lists/* \
 && ompi_info | grep -E 'Open MPI:|MCA (pmix|pml|osc): ' | tee /opt/hvd_async/mpi-stack.txt \
 && grep -q 'MCA osc: ucx' /opt/hvd_async/mpi-stack.txt \
 && .venv/bin/horovodrun --check-build | tee /tmp/check-build.txt \
 && grep -q '\[X\] PyTorch' /tmp/check-build.txt \
 && grep -q '\[X\] NCCL' /tmp/check-build.txt \
 && grep -Eq '\[X\] MPI' /tmp/check-build.txt \
 && grep -Eq '\[X\] Gloo' /tmp/check-build.txt \
 && rm /tmp/check-build.txt

COPY . .

# The non-root user, with an sshd of its own (port 2222, started by launch/kubeflow-mpijob.yaml's
# workers as `sshd -De -f /home/hvd/.sshd_config`; the MPI operator mounts the keys in ~/.ssh).
RUN useradd --create-home --shell /bin/bash --uid 1001 --user-group hvd \
 && mkdir -p /home/hvd/.ssh \
 && printf 'PidFile /home/hvd/sshd.pid\nHostKey /home/hvd/.ssh/id_rsa\nStrictModes no\nPort 2222\n' > /home/hvd/.sshd_config \
 && printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  Port 2222\n' >> /etc/ssh/ssh_config \
 && chown -R hvd:hvd /home/hvd /opt/hvd_async/src

ENV PATH=/opt/hvd_async/src/.venv/bin:$PATH
USER 1001:1001
WORKDIR /home/hvd
CMD ["hvd-async", "train", "--help"]
