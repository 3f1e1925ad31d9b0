"""The ``kairos`` umbrella command: simulation, reports and tools."""
