"""How many torch threads a rank runs (hvd_async.runtime.cpu_share): its CPUs over the ranks of its
node that may run on them, whatever the launcher (issue 22: under srun the job's total task count
was used, and the node's cores were divided by it)."""
from hvd_async.runtime import cpu_share

NODE = set(range(32))


def test_srun_without_binding_shares_the_node_among_its_tasks_only():
    # 2 nodes x 4 tasks, srun --cpu-bind=none: each task sees the 32 CPUs, 4 tasks on its node
    assert cpu_share(NODE, [NODE] * 4) == 8


def test_tasks_bound_to_their_own_cpus_keep_them():
    # srun binding each of 4 tasks to its --cpus-per-task=8 CPUs
    tasks = [set(range(8 * i, 8 * i + 8)) for i in range(4)]
    assert [cpu_share(t, tasks) for t in tasks] == [8, 8, 8, 8]


def test_ranks_bound_to_a_socket_share_that_socket():
    # mpirun --bind-to socket: 2 sockets of 16 CPUs, 4 ranks, 2 on each
    sockets = [set(range(16)), set(range(16, 32))]
    ranks = [sockets[0], sockets[1], sockets[0], sockets[1]]
    assert [cpu_share(r, ranks) for r in ranks] == [8, 8, 8, 8]


def test_more_ranks_than_cpus_run_one_thread_each():
    two = {0, 1}
    assert cpu_share(two, [two] * 5) == 1
    assert cpu_share({0}, [{0}, {1}]) == 1


def test_a_node_is_oversubscribed_when_more_ranks_may_run_on_a_rank_cpus_than_there_are():
    from hvd_async.runtime import oversubscribed

    two = {0, 1}
    assert not oversubscribed(two, [two, two])  # 2 unbound ranks on 2 cores
    assert oversubscribed(two, [two] * 3)  # 3 on 2 (mpirun --oversubscribe on this 2-core machine)
    assert oversubscribed({0}, [{0}, {0}])  # both bound to core 0
    assert not oversubscribed({0}, [{0}, {1}])  # each on its own core
    assert not oversubscribed(NODE, [NODE] * 32) and oversubscribed(NODE, [NODE] * 33)
