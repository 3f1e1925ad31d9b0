"""Whether a cell can admit a new agent now: the fleet-wide admission rule, one cell up.

A large fleet is split into cells, each with its own router (pair) and
instances; a front balancer sends each new agent to a cell (docs/cells.md).
Inside a cell, fleet admission (:mod:`controllers.admission`) places a newcomer
where it is admitted now whenever any instance would admit it. Across cells the
same rule needs the front balancer to send a start only to a cell that would
admit it now, and to hold it in a full cell only when every cell is full. The
balancer asks each cell this question (its router's ``GET /health/room``) and
the cell's router answers with :func:`cell_has_room`.

An agent start carries no prompt: the agent is placed at its first request, a
second or more later (the agent program's own start-up). So a start is sized by
the law's placeholder (point 1's 3000 tokens), and the agents this cell
accepted a moment ago that have not sent a request yet count as if they were
already placed: a burst of starts must not all see the room that only the
first of them will get.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from controllers.admission import AdmissionRule, InstanceGate, admits_now, with_admitted


def cell_has_room(
    gates: Sequence[InstanceGate],
    unplaced_tokens: Iterable[int],
    new_agent_tokens: int,
    rule: AdmissionRule,
) -> bool:
    """Would this cell admit one more new agent of ``new_agent_tokens`` now?

    ``gates`` are the cell's eligible instances as fleet admission sees them;
    ``unplaced_tokens`` the sizes of agents started here that have no instance
    yet. Each of those, then the newcomer, is placed on the first instance that
    admits it now (:func:`~controllers.admission.admits_now`: Eq. 13, nobody held
    ahead, no deferring daemon), and counted there for the next. True when every
    one of them finds such an instance; False with no eligible instance at all.
    """
    open_gates = list(gates)
    if not open_gates:
        return False
    for size in [*unplaced_tokens, new_agent_tokens]:
        index = next((k for k, g in enumerate(open_gates) if admits_now(g, size, rule)), None)
        if index is None:
            return False
        open_gates[index] = with_admitted(open_gates[index], size)
    return True
