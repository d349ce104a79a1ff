#!/usr/bin/env bash
# When to use: a cluster you reach over ssh with OpenMPI, a hostfile listing the nodes.
#   HOSTFILE=hosts NP=8 launch/mpirun.sh --algo ssgd --dataset cifar10 --data-dir /data/cifar
# hostfile lines look like "node1 slots=4". Ranks 0..servers-1 are parameter servers: with
# --map-by node they land one per node (the first nodes); with --map-by slot they pack onto node1.
# Across nodes, MPI windows need a one-sided component that works over the network (osc ucx).
set -euo pipefail
: "${HOSTFILE:?set HOSTFILE to your hostfile}" "${NP:?set NP to the number of MPI processes}"
exec mpirun -np "$NP" --hostfile "$HOSTFILE" --map-by "${MAP_BY:-node}" --bind-to none \
  -x PATH -x LD_LIBRARY_PATH -x PYTHONUNBUFFERED=1 -x HVD_ASYNC_LOG_LEVEL \
  --mca osc ucx \
  python -m hvd_async.train --np "$NP" "$@"
