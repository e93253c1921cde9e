"""``nsqd`` entry point: flags, logging, signals."""

from __future__ import annotations

import functools
import gc
import sys

from protocol.daemon import instantiate_failure, run_daemon, serve_until_signalled

from .metadata import DataDirLocked
from .options import parse_options, validate
from .server import NSQD
from .tls import TLSConfigError


#: CPython's cyclic GC looks at young objects every 700 allocations, and at the whole heap each time it
#: has grown by a quarter: with messages queued in memory that cost about 1 us per message kept (as much
#: as creating it; measured in bench/README.md). Messages never form garbage cycles (reference counting
#: frees them), so nsqd runs young collections 14x less often; whole-heap ones still follow the growth.
GC_THRESHOLDS = (10_000, 10, 10)


async def serve(opts) -> None:
    nsqd = NSQD(opts)
    nsqd.lock_data_path()  # before anything runs, so a refusal leaves nothing to stop
    gc.freeze()  # what startup made (modules, options) lives as long as the process: never scan it again
    gc.set_threshold(*GC_THRESHOLDS)
    await serve_until_signalled(nsqd)


def main(argv: list[str] | None = None) -> int:
    return run_daemon(argv, name="nsqd", parse_options=parse_options, validate=validate, serve=serve,
                      refusals=(DataDirLocked, TLSConfigError, OSError),
                      refusal_text=functools.partial(instantiate_failure, "nsqd"))


if __name__ == "__main__":
    sys.exit(main())
