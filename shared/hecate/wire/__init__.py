"""The wire contract: subjects (one module) and messages (msgspec structs)."""
