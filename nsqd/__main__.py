"""``nsqd`` entry point: flags, logging, the data directory's lock and the listening sockets, then signals.

Only light modules are imported up front: the lock and the sockets are taken (``metadata.prebind``) before trio
and the server are imported, which is most of start-up (see ``runtime.startup``)."""

from __future__ import annotations

import functools
import gc
import sys

from runtime.startup import instantiate_failure, run_daemon

from .metadata import DataDirLocked, Prebound, prebind
from .options import parse_options, validate
from .tls import TLSConfigError

#: CPython's cyclic GC looks at young objects every 700 allocations, and at the whole heap each time it
#: has grown by a quarter: with messages queued in memory that cost about 1 us per message kept (as much
#: as creating it; measured in bench/HISTORY.md). Messages never form garbage cycles (reference counting
#: frees them), so nsqd runs young collections 14x less often; whole-heap ones still follow the growth.
GC_THRESHOLDS = (10_000, 10, 10)


async def serve(opts, prebound: Prebound) -> None:
    from runtime.daemon import serve_until_signalled  # after the sockets exist: see above

    from .server import NSQD

    nsqd = NSQD(opts)
    nsqd.adopt(prebound)  # locked and bound before anything runs, so a refusal leaves nothing to stop
    gc.freeze()  # what startup made (modules, options) lives as long as the process: never scan it again
    gc.set_threshold(*GC_THRESHOLDS)
    nsqd.collector.install()  # and what survives a full collection is frozen too (runtime/collector.py)
    await serve_until_signalled(nsqd)


def _prebind(opts) -> Prebound:
    """``prebind``; with ``--workers`` above 1 the workers are forked here, after the sockets exist and before trio
    is imported (``supervisor.py``): this returns in each worker, while the parent watches them until they end."""
    prebound = prebind(opts)
    if opts.workers > 1:
        from .supervisor import start_workers  # only with workers

        return start_workers(opts, prebound)
    return prebound


def main(argv: list[str] | None = None) -> int:
    return run_daemon(
        argv,
        name="nsqd",
        parse_options=parse_options,
        validate=validate,
        serve=serve,
        refusals=(DataDirLocked, TLSConfigError, OSError),
        refusal_text=functools.partial(instantiate_failure, "nsqd"),
        prebind=_prebind,
    )


if __name__ == "__main__":
    sys.exit(main())
