"""``python -m supervisor``: the daemon's command line."""

from supervisor.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
