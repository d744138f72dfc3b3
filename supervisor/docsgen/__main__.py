"""``python -m supervisor.docsgen [--check]``."""

from supervisor.docsgen import main

raise SystemExit(main())
