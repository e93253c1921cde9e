"""nsqlookupd: the discovery daemon (registration database, "  V1" TCP protocol, HTTP API)."""
