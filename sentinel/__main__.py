"""Allow ``python -m sentinel``."""

from sentinel.cli import main

raise SystemExit(main())
