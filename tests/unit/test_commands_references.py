"""What ``publish`` and ``rollback`` make of secret references without resolving them."""

from __future__ import annotations

import pytest

from supervisor.commands.common import ReferenceResolver
from supervisor.config import RevisionConfig
from supervisor.revision.errors import RevisionError
from supervisor.revision.secrets import EnvFileResolver

CONFINED = RevisionConfig(secret_env_prefixes=("TEAM_",), secret_dirs=("/run/keys",))


@pytest.mark.parametrize("reference", ["env:TEAM_A", "file:/run/keys/a", "file:/run/keys/x/../b"])
def test_a_reference_inside_stands_in_for_its_value_unread(reference: str) -> None:
    # None of these exist here: nothing is looked up.
    assert ReferenceResolver(CONFINED).resolve(reference) == reference.encode()


@pytest.mark.parametrize("reference", ["env:HOME", "file:/etc/shadow", "file:/run/keys/../x",
                                       "file:/run/keysx/a"])
def test_a_reference_outside_is_refused_in_the_daemons_words(reference: str) -> None:
    with pytest.raises(RevisionError) as ours:
        ReferenceResolver(CONFINED).resolve(reference)
    with pytest.raises(RevisionError) as daemons:
        EnvFileResolver.from_config(CONFINED).resolve(reference)
    assert (ours.value.reason, ours.value.detail) == (daemons.value.reason, daemons.value.detail)
    assert ours.value.reason == "secret" and "outside [revision]" in ours.value.detail


def test_without_confinement_anything_stands_in() -> None:
    for reference in ("env:HOME", "file:/etc/shadow"):
        assert ReferenceResolver().resolve(reference) == reference.encode()
        assert ReferenceResolver(RevisionConfig()).resolve(reference) == reference.encode()
