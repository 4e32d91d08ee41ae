"""``python -m sparkonce.cli``, as ``python -m sparkonce``."""

from sparkonce.cli import main

raise SystemExit(main())
