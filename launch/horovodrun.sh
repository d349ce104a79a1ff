#!/usr/bin/env bash
# When to use: you already launch Horovod jobs with horovodrun, on one host or several over ssh.
#   one host:       NP=4 launch/horovodrun.sh --algo ssgd --epochs 10
#   several hosts:  NP=8 HOSTS=node1:4,node2:4 launch/horovodrun.sh --config launch/presets/dc-asgd.yaml
#   a hostfile:     NP=8 HOSTFILE=hosts launch/horovodrun.sh ...   (lines "node1 slots=4", as mpirun's)
#   your script:    PROGRAM="python train.py" NP=4 launch/horovodrun.sh --my-flag
# hvd_async needs the MPI controller (its parameter servers and gossip use MPI windows beside
# Horovod), so --mpi is always passed; a Gloo launch is refused at hvd_async.init(). Server ranks are
# ranks 0..servers-1 and horovodrun fills hosts in order: with HOSTS=node1:4,node2:4 and one server,
# the server shares node1 with three workers. For one server per node, or a node of its own, use
# launch/mpirun.sh (--map-by node, or a hostfile whose first line is the server node).
# Across hosts the windows need OpenMPI's UCX one-sided component: MPI_ARGS below passes it.
set -euo pipefail
: "${NP:?set NP to the number of processes, servers included}"
MPI_ARGS=${MPI_ARGS:---mca osc ucx -x UCX_TLS=${UCX_TLS:-tcp,self}}
hosts=()
if [[ -n ${HOSTS:-} ]]; then hosts=(-H "$HOSTS"); elif [[ -n ${HOSTFILE:-} ]]; then hosts=(--hostfile "$HOSTFILE"); fi
# shellcheck disable=SC2086  # PROGRAM and MPI_ARGS are word lists on purpose
if [[ -n ${PROGRAM:-} ]]; then
  exec horovodrun --mpi --mpi-args="$MPI_ARGS" -np "$NP" "${hosts[@]}" $PROGRAM "$@"
fi
exec horovodrun --mpi --mpi-args="$MPI_ARGS" -np "$NP" "${hosts[@]}" python -m hvd_async.train --np "$NP" "$@"
