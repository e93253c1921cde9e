"""NSQ's six utilities (``nsq_to_file``, ``nsq_tail``, ``to_nsq``, ``nsq_stat``, ``nsq_to_http``, ``nsq_to_nsq``)
with NSQ 1.3.0's names, flags and defaults, built on the ``trionsq`` client. One module per tool; ``_cli`` holds
what they share."""
