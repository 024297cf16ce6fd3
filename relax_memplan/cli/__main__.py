"""``python -m relax_memplan.cli``: the ``relax-memplan`` command."""

import sys

from .entry import main

sys.exit(main())
