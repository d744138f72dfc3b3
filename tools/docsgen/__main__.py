"""``python -m tools.docsgen [--check]``."""

from tools.docsgen import main

raise SystemExit(main())
