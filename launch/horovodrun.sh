#!/usr/bin/env bash
# When to use: you already launch Horovod jobs with horovodrun, on one host or several over ssh.
#   one host:       NP=4 launch/horovodrun.sh --algo ssgd --epochs 10
#   several hosts:  NP=9 HOSTS=node1:5,node2:4 launch/horovodrun.sh --config dc-asgd --servers 1
#   a hostfile:     NP=8 HOSTFILE=hosts launch/horovodrun.sh ...   (lines "node1 slots=4", as mpirun's)
#   your script:    PROGRAM="python train.py" NP=4 launch/horovodrun.sh --my-flag
# Device: the reference job gets --device "${DEVICE:-auto}": one GPU per worker where the processes
# see GPUs, the CPU where they see none. DEVICE=cuda refuses to start (exit 2, one line) where a
# worker sees no GPU: use it on a GPU cluster to make a missing GPU loud. DEVICE=cpu forces the CPU.
# The script's --device wins over a --config file's `device:` (set DEVICE instead); a --device of
# your own after the script's name wins over both. Your own PROGRAM picks its own device.
# hvd_async needs the MPI controller (its parameter servers and gossip use MPI windows beside
# Horovod), so --mpi is always passed; a Gloo launch is refused at hvd_async.init(). Server ranks are
# ranks 0..servers-1 and horovodrun fills hosts in order. Servers are CPU processes (no GPU), so
# give the first host one slot per server beyond its GPUs: HOSTS=node1:5,node2:4 with --servers 1
# and NP=9 puts the server and 4 workers on node1, 4 workers on node2, every GPU busy; HOSTS=
# node1:4,node2:4 NP=8 would leave one of node1's GPUs idle. For one server per node, or a node of
# their own, use launch/mpirun.sh (--map-by node, or a hostfile whose first line is the server node).
# Across hosts the windows need OpenMPI's UCX one-sided component: passed where `ompi_info` lists
# it (MPI_ARGS replaces that choice). UCX_TLS=tcp,self on plain Ethernet; leave it unset on
# InfiniBand to let UCX choose.
# Environment: horovodrun passes the whole environment to the ranks (-x for each variable), NCCL's
# included: NCCL_DEBUG defaults to WARN here; horovodrun's --network-interface (or
# NCCL_SOCKET_IFNAME) picks NCCL's interface. launch/README.md lists them.
set -euo pipefail
: "${NP:?set NP to the number of processes, servers included}"
if [[ -z ${MPI_ARGS+set} ]]; then
  MPI_ARGS=""
  if command -v ompi_info >/dev/null && ompi_info 2>/dev/null | grep -q "MCA osc: ucx"; then
    MPI_ARGS="--mca osc ucx"
  else
    echo "horovodrun.sh: warning: ompi_info lists no 'MCA osc: ucx' (an OpenMPI without UCX): one host works," \
         "a multi-host job stops at start-up; use an OpenMPI built with UCX" >&2
  fi
fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
hosts=()
if [[ -n ${HOSTS:-} ]]; then hosts=(-H "$HOSTS"); elif [[ -n ${HOSTFILE:-} ]]; then hosts=(--hostfile "$HOSTFILE"); fi
mpi_args=()
[[ -n $MPI_ARGS ]] && mpi_args=(--mpi-args="$MPI_ARGS")
# shellcheck disable=SC2086  # PROGRAM is a word list on purpose
if [[ -n ${PROGRAM:-} ]]; then
  exec horovodrun --mpi "${mpi_args[@]}" -np "$NP" "${hosts[@]}" $PROGRAM "$@"
fi
exec horovodrun --mpi "${mpi_args[@]}" -np "$NP" "${hosts[@]}" python -m hvd_async.job.train --np "$NP" \
  --device "${DEVICE:-auto}" "$@"
