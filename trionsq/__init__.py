"""trionsq: an NSQ client for Trio (and a blocking one in ``trionsq.blocking``).

The V2 protocol's client side is written once, sans I/O, in ``trionsq._core``; the trio driver
(``Connection``, ``Producer``, ``Consumer``) and the blocking driver run it over their sockets.

Importing the package does not import trio: the trio driver's names are loaded on first use
(PEP 562 ``__getattr__``), so ``trionsq.blocking`` works in processes that must stay trio-free
(Spark's Python workers).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._config import Config as Config
from ._core import AuthResult as AuthResult
from ._core import Features as Features
from ._errors import ConnectError as ConnectError
from ._errors import ConnectionClosed as ConnectionClosed
from ._errors import NoAvailableNsqd as NoAvailableNsqd
from ._errors import NSQError as NSQError
from ._lookupd import LookupdError as LookupdError
from ._lookupd import lookup as lookup
from ._message import Message as Message
from ._version import __version__ as __version__

if _TYPE_CHECKING:
    from ._connection import Connection as Connection
    from ._connection import open_connection as open_connection
    from ._consumer import Consumer as Consumer
    from ._consumer import ConsumerStats as ConsumerStats
    from ._producer import Producer as Producer
    from ._producer import ProducerStats as ProducerStats

# the trio driver: name -> module, imported by __getattr__ on first use
_TRIO_NAMES = {
    "Connection": "._connection",
    "open_connection": "._connection",
    "Consumer": "._consumer",
    "ConsumerStats": "._consumer",
    "Producer": "._producer",
    "ProducerStats": "._producer",
}


def __getattr__(name: str) -> _Any:
    module = _TRIO_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'trionsq' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_TRIO_NAMES})
