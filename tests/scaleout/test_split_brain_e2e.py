"""Split brain, end to end (docs/scale-out.md, "Split brain"): the leader is
SIGSTOPped past its lease, the standby takes over, and the old leader is
SIGCONTed under load. It must report itself standby, refuse every request with
``not_leader`` naming the new leader, have no write of its own land in the store
after the pause (the fence refuses them), and no agent may change instance."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kairos_common.wire import ROLE_STANDBY, is_not_leader
from tests.scaleout.cluster import first_success_after, http_get, running_cluster, wait_for
from tests.scaleout.services import HAPROXY, REDIS_SERVER, skip_unless

pytestmark = [pytest.mark.scaleout, pytest.mark.e2e, pytest.mark.timeout(300)]
AGENTS = 8


def test_a_leader_paused_past_its_lease_is_fenced_and_stands_by(tmp_path: Path) -> None:
    skip_unless(REDIS_SERVER, HAPROXY)
    with running_cluster(tmp_path, agents=AGENTS) as cluster:
        a, b = cluster.routers["a"], cluster.routers["b"]
        a_id = str((a.ready() or {})["router_id"])
        before = {r["agent_id"]: r for r in cluster.snapshot().agents}
        t_stop = time.time()
        a.service.pause()
        wait_for("b to take over", lambda: b.role() == "leader", 15)
        b_id = str((b.ready() or {})["router_id"])
        a.service.resume()
        t_cont = time.time()
        wait_for("a to report standby", lambda: (a.ready() or {}).get("role") == ROLE_STANDBY, 10)
        body = a.ready() or {}
        assert body["ready"] is False and body["leader_url"] == b.url
        assert "lease" in body["reason"] or "fence" in body["reason"]
        got = http_get(a.url + "/kairos/v1/instances")
        assert got is not None and is_not_leader(got[0], json.loads(got[1]))
        wait_for("every agent to be served by b after a woke",
                 lambda: len(first_success_after(cluster, t_cont)) == AGENTS, 30)  # fmt: skip
        assert b.role() == "leader" and a.role() == ROLE_STANDBY

        writers = cluster.stream_writers()
        late_a = [i for i, w in writers if w == a_id and int(i.split("-")[0]) > t_stop * 1000]
        assert not late_a, f"batches of the paused leader landed after the pause: {late_a}"
        assert any(w == b_id for _, w in writers)
        stepped = a.log_events("stepped_down") + a.log_events("write_refused_by_fence")
        assert stepped, "the old leader did not log why it stood down"
        after = {r["agent_id"]: r for r in cluster.snapshot().agents}
        assert after.keys() == before.keys()
        for agent_id, row in after.items():  # nobody was assigned a second instance
            assert row["instances"] == before[agent_id]["instances"], agent_id
        got = http_get(a.url + "/health")
        assert got is not None and got[0] == 200  # alive, just not the leader
