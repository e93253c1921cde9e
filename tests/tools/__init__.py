"""The utilities end to end: each tool as a subprocess against real nsqd and nsqlookupd."""
