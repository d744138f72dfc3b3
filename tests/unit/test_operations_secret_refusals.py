"""The "Day two" session of docs/operations.md is real output: its refusal lines are what
the code prints.

The session was recorded from the console script; the messages it quotes drift when
the code's wording changes (it once said "is not set" after the resolver had learned
to say "is not set or empty"). This holds the quoted refusals to the resolver's text.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.revision.errors import RevisionError
from supervisor.revision.secrets import EnvFileResolver

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _day_two() -> str:
    text = OPERATIONS.read_text()
    return text.split("\n## Day two: publish, refuse, roll back, prune\n", 1)[1].split("\n## ", 1)[0]


def test_every_quoted_secret_refusal_is_the_resolvers_own_words() -> None:
    quoted = re.findall(r"(\$\.keys\.[\w-]+\.secret): (environment variable (\w+) [^;\n]*)",
                        _day_two())
    assert len(quoted) >= 3, quoted
    for _path, message, name in quoted:
        with pytest.raises(RevisionError) as refused:
            EnvFileResolver(environ={}).resolve(f"env:{name}")
        assert refused.value.detail == message
