"""Record formats and metric definitions shared by the daemon, the router and
the simulator, and the ``kairos report`` implementation that reads them all."""
