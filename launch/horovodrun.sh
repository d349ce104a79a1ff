#!/usr/bin/env bash
# When to use: Horovod's own launcher, on one host (HOSTS unset) or several (HOSTS=node1:4,node2:4).
#   NP=4 launch/horovodrun.sh --algo ssgd --epochs 10
# hvd_async needs the MPI controller (it uses MPI windows beside Horovod): --mpi is passed.
set -euo pipefail
: "${NP:?set NP to the number of processes}"
exec horovodrun --mpi -np "$NP" ${HOSTS:+-H "$HOSTS"} python -m hvd_async.train --np "$NP" "$@"
