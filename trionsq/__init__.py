"""trionsq: an NSQ client for Trio (and a blocking one in ``trionsq.blocking``).

The V2 protocol's client side is written once, sans I/O, in ``trionsq._core``; the trio driver
(``Connection``, ``Producer``, ``Consumer``) and the blocking driver run it over their sockets.
"""

from ._config import Config as Config
from ._connection import Connection as Connection
from ._connection import open_connection as open_connection
from ._core import AuthResult as AuthResult
from ._core import Features as Features
from ._errors import ConnectError as ConnectError
from ._errors import ConnectionClosed as ConnectionClosed
from ._errors import NoAvailableNsqd as NoAvailableNsqd
from ._errors import NSQError as NSQError
from ._message import Message as Message
from ._producer import Producer as Producer
from ._producer import ProducerStats as ProducerStats
from ._version import __version__ as __version__
