"""Which node runs what: server ids and client ranks placed on the run's nodes, and the nodes
left after exclusions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchfs.nodes import Exclusion, Node

#: Servers plus client ranks one host may run: far more than any node has cores, far fewer
#: than a typo (`--clients 100000`) would start.
MAX_PROCESSES_PER_HOST = 1024


@dataclass(frozen=True)
class NodeRoles:
    """Which server ids run on which node, and which node each client rank runs on."""

    servers: list[tuple[int, Node]]
    clients: list[Node]

    def nodes(self) -> list[Node]:
        """Every node that runs something, in nodes-file order, once."""
        seen: dict[str, Node] = {}
        for _, node in self.servers:
            seen.setdefault(node.name, node)
        for node in self.clients:
            seen.setdefault(node.name, node)
        return list(seen.values())


def plan_roles(
    nodes: Sequence[Node],
    servers: int | None,
    clients: int | None,
    server_nodes: int | None = None,
    servers_per_node: int | None = None,
    clients_per_node: int | None = None,
    clients_on_all: bool = False,
) -> NodeRoles:
    """Place servers and client ranks on nodes.

    Servers go on the first `server_nodes` nodes (all of them by default); clients on the
    others when `server_nodes` leaves some, else (or with `clients_on_all`) on every node.
    Per-node counts put that many
    on each node of the set (server i on node i // per-node); totals spread over the set
    (servers round-robin, clients in blocks so that a node's ranks are consecutive).
    Neither given: one per node. ValueError says what does not fit.
    """
    if not nodes:
        raise ValueError("no nodes left to run on")
    k = len(nodes) if server_nodes is None else server_nodes
    if not 1 <= k <= len(nodes):
        raise ValueError(f"--server-nodes {k}: the run has {len(nodes)} nodes")
    server_set = list(nodes[:k])
    client_set = list(nodes[k:]) if k < len(nodes) and not clients_on_all else list(nodes)
    if servers is not None and servers_per_node is not None:
        raise ValueError("give --servers or --servers-per-node, not both")
    if clients is not None and clients_per_node is not None:
        raise ValueError("give --clients or --clients-per-node, not both")
    if servers is None:
        per = servers_per_node or 1
        placed = [(i, server_set[i // per]) for i in range(per * len(server_set))]
    else:
        placed = [(i, server_set[i % len(server_set)]) for i in range(servers)]
    if clients is None:
        per = clients_per_node or 1
        ranks = [client_set[r // per] for r in range(per * len(client_set))]
    else:
        ranks = [client_set[r * len(client_set) // clients] for r in range(clients)]
    if not placed or not ranks:
        raise ValueError("a run needs at least one server and one client")
    per_host = Counter([n.host for _, n in placed] + [n.host for n in ranks])
    host, most = per_host.most_common(1)[0]
    if most > MAX_PROCESSES_PER_HOST:
        raise ValueError(
            f"{len(placed)} servers and {len(ranks)} clients put {most} processes on host "
            f"{host}: at most {MAX_PROCESSES_PER_HOST} per host"
        )
    return NodeRoles(placed, ranks)


def apply_exclusions(
    nodes: Sequence[Node], excluded: Sequence[Exclusion]
) -> tuple[list[Node], list[dict[str, Any]]]:
    """The nodes left after `excluded` (matched by host or node name, short names too), and
    the manifest's `excluded` list ({host, reasons}) of the nodes that were removed."""
    reasons: dict[str, tuple[str, ...]] = {}
    for e in excluded:
        reasons.setdefault(e.host, e.reasons)
        reasons.setdefault(e.host.split(".", 1)[0], e.reasons)
    kept: list[Node] = []
    removed: list[dict[str, Any]] = []
    for node in nodes:
        keys = (node.host, node.host.split(".", 1)[0], node.name)
        hit = next((k for k in keys if k in reasons), None)
        if hit is None:
            kept.append(node)
        else:
            removed.append({"host": node.host, "node": node.name, "reasons": list(reasons[hit])})
    return kept, removed
