"""Repository tooling that is not part of the installed daemon (run from the repository root)."""
