"""Plugin entry point of agent-stores-postgres (filled in by the backend issue)."""
