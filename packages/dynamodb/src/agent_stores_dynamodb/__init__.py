"""Amazon DynamoDB backend for agent-stores (aiobotocore, async)."""
