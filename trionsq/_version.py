"""The version of the trionsq distribution (the client, the daemons and the tools), written here and nowhere else.

pyproject.toml reads it at build time (setuptools' dynamic version) and the client sends it in its default IDENTIFY
``user_agent`` (``trionsq/<version>``). It is not the NSQ version that nsqd, nsqlookupd and the tools report to
clients (``--version``, IDENTIFY, ``/info``, ``/stats``): that is ``protocol.version.NSQ_VERSION``, the NSQ release
whose behaviour is implemented, which clients check.
"""

__version__ = "0.1.0"
