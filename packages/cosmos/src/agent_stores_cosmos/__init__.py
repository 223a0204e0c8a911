"""Azure Cosmos DB for NoSQL backend for agent-stores (azure-cosmos aio)."""
