"""Console entry of ``relax-memplan``: imports the CLI with Ctrl-C handled.

Importing :mod:`relax_memplan` loads TVM (a second or more). A Ctrl-C in that time came as a
``KeyboardInterrupt`` traceback before the CLI's own handler existed; here it is the CLI's one
line, ``relax-memplan: interrupted``, and exit status 130. A top-level module because any
module inside the package imports the package (and TVM) first.
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
