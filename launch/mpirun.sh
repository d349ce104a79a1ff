#!/usr/bin/env bash
# When to use: a cluster you reach over ssh with OpenMPI and a hostfile listing the nodes
# (launch/hostfile.example), when you want to choose where the parameter servers run.
#   HOSTFILE=hosts NP=10 launch/mpirun.sh --config dc-asgd --servers 2
#   HOSTFILE=hosts NP=10 PLACE=packed launch/mpirun.sh --algo asgd --servers 2 --dataset cifar10 --data-dir /data/cifar --model resnet18
#   your script:  PROGRAM="python train.py" HOSTFILE=hosts NP=8 launch/mpirun.sh --my-flag
#
# Device: the reference job gets --device "${DEVICE:-auto}": one GPU per worker on every node where
# the processes see GPUs, the CPU where they see none. DEVICE=cuda refuses to start (exit 2, one
# line) where a worker sees no GPU: use it on a GPU cluster to make a missing GPU loud. DEVICE=cpu
# forces the CPU. The script's --device wins over a --config file's `device:` (set DEVICE instead);
# a --device of your own after the script's name wins over both. Your own PROGRAM picks its device.
#
# Where the servers go. Ranks 0..servers-1 are the parameter servers (hvd_async.init(servers=S));
# the rest are workers. Servers are CPU processes: they use no GPU. PLACE picks OpenMPI's mapping:
#   PLACE=spread (default, --map-by node): ranks go round-robin over the nodes, so the S servers
#     land one per node on the first S nodes, each sharing its node with workers. With one server
#     per node give each node GPUs + 1 slots and NP = GPUs + servers: two 4-GPU nodes
#     ("gpu1 slots=5", "gpu2 slots=5"), NP=10 --servers 2: a server and 4 workers per node, no GPU
#     idle. NP=8 on the same nodes would leave 2 GPUs idle (6 workers for 8 GPUs).
#   PLACE=packed (--map-by slot): ranks fill each node's slots in hostfile order, so the servers
#     pack onto the first node. Give the servers a node of their own by listing it first with
#     exactly S slots ("psnode slots=2"), then the GPU nodes with one slot per GPU: no GPU idle.
# Check the placement without training: add --display-map to MPI_ARGS.
#
# Across nodes MPI windows need a one-sided component that works over the network: osc ucx,
# passed where `ompi_info` lists it (as launch/slurm.sbatch does; OMPI_MCA_osc set by you wins);
# without it the script says so and a multi-node job stops at start-up. UCX_TLS=tcp,self on
# plain Ethernet; leave UCX_TLS unset on InfiniBand to let UCX choose.
# Environment: every NCCL_*, UCX_* and HVD_ASYNC_* variable set here is passed to the ranks
# (mpirun over ssh passes nothing it is not told to). NCCL_DEBUG defaults to WARN (NCCL's errors
# explained); set NCCL_SOCKET_IFNAME=eth0 (or ^lo,docker) where NCCL picks the wrong interface.
# launch/README.md lists them.
set -euo pipefail
: "${HOSTFILE:?set HOSTFILE to your hostfile}" "${NP:?set NP to the number of MPI processes, servers included}"
case ${PLACE:-spread} in
  spread) map_by=node ;;
  packed) map_by=slot ;;
  *) echo "PLACE must be spread or packed, got '$PLACE'" >&2; exit 2 ;;
esac
osc=()
if [[ -z ${OMPI_MCA_osc:-} ]]; then
  if command -v ompi_info >/dev/null && ompi_info 2>/dev/null | grep -q "MCA osc: ucx"; then
    osc=(--mca osc ucx)
  else
    echo "mpirun.sh: warning: ompi_info lists no 'MCA osc: ucx' (an OpenMPI without UCX): one node works," \
         "a multi-node job stops at start-up; use an OpenMPI built with UCX, or set OMPI_MCA_osc" >&2
  fi
fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
env_args=()
while read -r name; do
  env_args+=(-x "$name")
done < <(compgen -e | grep -E '^(NCCL|UCX|HVD_ASYNC)_' || true)
read -r -a program <<<"${PROGRAM:-python -m hvd_async.job.train --np $NP --device ${DEVICE:-auto}}"
read -r -a extra <<<"${MPI_ARGS:-}"
exec mpirun -np "$NP" --hostfile "$HOSTFILE" --map-by "$map_by" --bind-to none \
  -x PATH -x LD_LIBRARY_PATH -x PYTHONUNBUFFERED=1 "${env_args[@]}" \
  "${osc[@]}" "${extra[@]}" \
  "${program[@]}" "$@"
