"""The protocol simulation's old module name: see :mod:`sparkonce.verify.sim`.

``python -m sparkonce.verify.simulation`` runs the same command line as
``python -m sparkonce.verify.sim``.
"""

from __future__ import annotations

import sys

from sparkonce.verify.sim import *  # noqa: F403
from sparkonce.verify.sim import __all__  # noqa: F401
from sparkonce.verify.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
