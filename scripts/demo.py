"""``make demo``: placeholder walk-through of the KAIROS control law.

Replaced by the end-to-end demo (fake vLLM + daemons + router + agents) once
those components land. Prints the clock, boost and admission decisions for a
ramp of aggregate context on a simulated H100 level set.
"""

from __future__ import annotations

from controllers import AgentView, FrequencyLevels, InstanceSnapshot, KairosController


def main() -> None:
    levels = FrequencyLevels.from_supported(range(210, 1786, 15), floor_mhz=660, num_levels=8)
    ctrl = KairosController(levels)
    cap = 400_000
    print(f"levels (MHz): {levels.clocks_mhz}; U_max = {cap} tokens")
    print(f"{'U':>8} {'U/Umax':>7} {'clock':>6} {'boost':>6} {'admit':>6} {'defer':>6}")
    for i in range(0, 21):
        u = i * cap // 20
        ongoing = (
            AgentView(
                "a", 0.0, context_tokens=u, decode_tokens=500, llm_time_s=10.0, completed_steps=3
            ),
        )
        pending = (AgentView("p", 1.0, context_tokens=None),)
        d = ctrl.decide(
            InstanceSnapshot(
                now_s=5.0, epoch=i, capacity_tokens=cap, ongoing=ongoing, pending=pending
            )
        )
        print(
            f"{u:>8} {u / cap:>7.2f} {d.clock_mhz:>6} {d.boost!s:>6} {len(d.admit):>6} "
            f"{d.defer_admissions!s:>6}"
        )


if __name__ == "__main__":
    main()
