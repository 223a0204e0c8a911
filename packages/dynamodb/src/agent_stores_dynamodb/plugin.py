"""The agent-stores plugin of agent-stores-dynamodb (entry point in group ``agent_stores``)."""
