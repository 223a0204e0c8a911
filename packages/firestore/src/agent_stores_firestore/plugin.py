"""The agent-stores plugin of agent-stores-firestore (entry point in group ``agent_stores``)."""
