"""What the three daemons (nsqd, nsqlookupd, nsqadmin) share at run time, around the wire formats of ``protocol``.

- ``flags``: the command line with Go's ``flag`` rules, the ``--config`` TOML file, and the options dataclasses
  whose fields declare the flags (``DaemonOptions``, ``setting``);
- ``logfmt``: NSQ's one-line log format on the standard ``logging`` module;
- ``startup``: the part of start-up that runs before trio is imported (flags, FATAL lines, listen addresses read
  with Go's rules, binding TCP and unix sockets);
- ``daemon``: the trio half (running until a signal, accept loops, start-up failures as one FATAL line);
- ``http_server``: the trio driver of ``protocol.http`` (listeners, connections, timeouts, pipelining);
- ``http_client``: one short HTTP/1.1 exchange as a client (nsqd's auth and lookupd queries, nsqadmin's calls).

``protocol`` is pure (bytes in, events out, no sockets, no clock); everything here may do I/O.
"""
