"""``python -m probe``: the same as ``eval-probe``."""

from probe.cli import main

raise SystemExit(main())
