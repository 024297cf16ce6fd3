"""Console entry of ``relax-memplan``: imports the CLI with Ctrl-C handled.

A Ctrl-C while :mod:`relax_memplan.cli` is being imported comes before the CLI's own handler
exists; here it is the CLI's one line, ``relax-memplan: interrupted``, and exit status 130,
not a ``KeyboardInterrupt`` traceback. A top-level module, outside the package it imports.
"""

import importlib
import sys

EXIT_INTERRUPTED = 130  # the same as relax_memplan.cli.EXIT_INTERRUPTED


def main(argv=None) -> int:
    """Import :mod:`relax_memplan.cli` and run its ``main(argv)``; 130 if interrupted while
    importing."""
    try:
        cli = importlib.import_module("relax_memplan.cli")
    except KeyboardInterrupt:
        print("relax-memplan: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
