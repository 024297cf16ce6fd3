"""The ``relax-memplan`` command line: :func:`main` (``main(argv)`` returns the exit status).

- :mod:`.entry`: :func:`main`, the exit statuses, Ctrl-C and broken pipes;
- :mod:`.parser`: the argument parser; :mod:`.args`: argument types and checks;
- :mod:`.commands`: ``compile``, ``run``, ``inspect`` and ``bench``, each calling a library
  function (:mod:`relax_memplan.compile`, :mod:`relax_memplan.tools`) and printing its result;
- :mod:`.console`: phase progress and TVM's native log lines; :mod:`.interrupt`: Ctrl-C
  while TVM's C++ code runs; :mod:`.arena_warning`: an arena larger than this machine's memory.
"""

from .entry import (EXIT_BROKEN_PIPE, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_VERIFY_FAILED, main)
from .parser import build_parser

__all__ = ["main", "build_parser", "EXIT_ERROR", "EXIT_VERIFY_FAILED", "EXIT_INTERRUPTED",
           "EXIT_BROKEN_PIPE"]
