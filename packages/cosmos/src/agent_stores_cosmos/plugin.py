"""The agent-stores plugin of agent-stores-cosmos (entry point in group ``agent_stores``)."""
