"""The client package's tests: the trio and blocking drivers against real nsqd and nsqlookupd."""
