"""``python -m sparkonce.verify.sim``: see :mod:`sparkonce.verify.sim.cli`."""

import sys

from sparkonce.verify.sim.cli import main

sys.exit(main())
