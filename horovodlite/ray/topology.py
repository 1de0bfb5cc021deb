"""Where the ranks of a ``RayExecutor`` go: pure functions of what each worker actor reports.

Each actor reports its node (``node_info`` in ``worker.py``): Ray's node id, the node's IP as
Ray sees it, the host name, and the GPUs Ray gave it. From that list (actor i's node at i):

1. Ranks are ordered by node: the actors of one node get consecutive ranks, nodes in the order
   of their first actor, so local ranks are 0..k-1 on every node and the cross layout is simple.
2. Each rank's host name (``HOROVOD_HOSTNAME``), which tells the runtime which ranks share
   memory: the node's IP; two Ray nodes on one IP (several raylets on one machine, or
   containers sharing the host's network) get the node id appended, since only one raylet's
   actors are sure to share ``/dev/shm``.
3. With GPUs, every actor of a node sees all the GPUs of that node's actors, listed in local
   rank order, so ``torch.cuda.set_device(hvd.local_rank())`` picks the actor's own GPU and
   NCCL can reach its neighbours' (Ray gives each actor only its own by default).
"""

from __future__ import annotations


def rank_order(nodes: list) -> list:
    """The actor index of each rank (see 1. above)."""
    groups: dict = {}
    for i, node in enumerate(nodes):
        groups.setdefault(node["node_id"], []).append(i)
    return [i for members in groups.values() for i in members]


def host_names(nodes: list) -> list:
    """Each actor's host name (see 2. above), in actor order."""
    ids_per_ip: dict = {}
    for node in nodes:
        ids_per_ip.setdefault(node["ip"], set()).add(node["node_id"])
    return [node["ip"] if len(ids_per_ip[node["ip"]]) == 1
            else f"{node['ip']}-{node['node_id'][:8]}" for node in nodes]


def visible_devices(nodes: list, order: list) -> list:
    """``CUDA_VISIBLE_DEVICES`` of each rank (see 3. above), in rank order."""
    per_node: dict = {}
    for i in order:
        ids = per_node.setdefault(nodes[i]["node_id"], [])
        ids += [str(g) for g in nodes[i]["gpu_ids"] if str(g) not in ids]
    return [",".join(per_node[nodes[i]["node_id"]]) for i in order]
