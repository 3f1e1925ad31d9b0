"""What would Kairos save here? Fit an engine, replay a recorded fleet (docs/whatif.md).

``kairos calibrate`` probes a running vLLM and fits the simulator's timing model
to it (:mod:`whatif.calibrate_cli`); the router records each agent's program
(:mod:`router.trace_recorder`); ``kairos whatif`` replays the recording on the
fitted engine under every policy and, in its comparison mode, beside the
recorded run itself (:mod:`whatif.cli`).
"""
