"""Google Cloud Firestore backend for agent-stores (google-cloud-firestore AsyncClient)."""
