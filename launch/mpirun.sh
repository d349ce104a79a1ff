#!/usr/bin/env bash
# When to use: a cluster you reach over ssh with OpenMPI and a hostfile listing the nodes
# (launch/hostfile.example), when you want to choose where the parameter servers run.
#   HOSTFILE=hosts NP=9 launch/mpirun.sh --config launch/presets/dc-asgd.yaml --servers 1
#   HOSTFILE=hosts NP=10 PLACE=spread launch/mpirun.sh --algo asgd --servers 2 --dataset cifar10 --data-dir /data/cifar --model resnet18
#   your script:  PROGRAM="python train.py" HOSTFILE=hosts NP=8 launch/mpirun.sh --my-flag
#
# Where the servers go. Ranks 0..servers-1 are the parameter servers (hvd_async.init(servers=S));
# the rest are workers. PLACE picks OpenMPI's mapping:
#   PLACE=spread (default, --map-by node): ranks go round-robin over the nodes, so the S servers
#     land one per node on the first S nodes, each sharing its node with workers. Use it with one
#     shard per node (--servers = nodes) to spread the servers' network load.
#   PLACE=packed (--map-by slot): ranks fill each node's slots in hostfile order, so the servers
#     pack onto the first node. Give the servers a node of their own by listing it first with
#     exactly S slots ("psnode slots=2"), then the GPU nodes.
# Check the placement without training: add --display-map to MPI_ARGS.
# Across nodes MPI windows need a one-sided component that works over the network: osc ucx
# (UCX_TLS=tcp,self on plain Ethernet; leave UCX_TLS unset on InfiniBand to let UCX choose).
set -euo pipefail
: "${HOSTFILE:?set HOSTFILE to your hostfile}" "${NP:?set NP to the number of MPI processes, servers included}"
case ${PLACE:-spread} in
  spread) map_by=node ;;
  packed) map_by=slot ;;
  *) echo "PLACE must be spread or packed, got '$PLACE'" >&2; exit 2 ;;
esac
ucx_tls=()
[[ -n ${UCX_TLS:-} ]] && ucx_tls=(-x "UCX_TLS=$UCX_TLS")
read -r -a program <<<"${PROGRAM:-python -m hvd_async.train --np $NP}"
read -r -a extra <<<"${MPI_ARGS:-}"
exec mpirun -np "$NP" --hostfile "$HOSTFILE" --map-by "$map_by" --bind-to none \
  -x PATH -x LD_LIBRARY_PATH -x PYTHONUNBUFFERED=1 -x HVD_ASYNC_LOG_LEVEL \
  --mca osc ucx "${ucx_tls[@]}" "${extra[@]}" \
  "${program[@]}" "$@"
