"""The build of nsqd's optional C accelerator (``nsqd/_speedups.c``); everything else is in pyproject.toml.

``pip install -e .`` (``make run``, ``make test``) compiles it where a C compiler and Python's headers are
present (Debian: ``build-essential`` and ``python3-dev``). Where they are not, or the build fails, the install goes
on without it and nsqd uses the same functions in Python (``nsqd/fastpath.py``). The same holds for the sdist
(``python -m build``) installed where no compiler is reachable; the wheel carries the compiled extension.
``tests/test_packaging.py`` checks both.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: the accelerator is optional."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler at all, missing headers
            print(f"warning: nsqd's C accelerator not built ({exc}); the Python fallback is used", file=sys.stderr)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: {ext.name} not built ({exc}); the Python fallback is used", file=sys.stderr)


setup(
    ext_modules=[Extension("nsqd._speedups", ["nsqd/_speedups.c"], optional=True, extra_compile_args=["-O2"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
