"""Plugin entry point of agent-stores-redis (filled in by the backend issue)."""
