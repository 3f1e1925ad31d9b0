"""kairos-router: agent-aware, power-aware OpenAI-compatible router."""
