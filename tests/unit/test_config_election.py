"""[kubernetes] leader-election keys: defaults, bounds, and how they must relate."""

from __future__ import annotations

import pytest

from supervisor.configfile import load_text
from supervisor.errors import ConfigError


def test_defaults_are_controller_runtimes() -> None:
    kube = load_text("").kubernetes
    assert kube.leader_election is True
    assert kube.lease_name == "trio-supervisor-fanout"
    assert (kube.lease_duration_s, kube.renew_deadline_s, kube.retry_period_s) == (15, 10, 2)
    assert kube.identity is None


@pytest.mark.parametrize(("text", "path", "words"), [
    ("renew_deadline_s = 15", "$.kubernetes.renew_deadline_s", "less than kubernetes.lease"),
    ("lease_duration_s = 5", "$.kubernetes.renew_deadline_s", "less than kubernetes.lease"),
    ("retry_period_s = 10", "$.kubernetes.retry_period_s", "less than kubernetes.renew"),
    ("lease_name = \"Not_A_Name\"", "$.kubernetes.lease_name", "match"),
    ("identity = \"\"", "$.kubernetes.identity", "length"),
    ("identity = \"a b\"", "$.kubernetes.identity", "match"),
    ("lease_duration_s = 0.5", "$.kubernetes.lease_duration_s", ">= 1"),
])
def test_refusals_name_the_key(text: str, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(f"[kubernetes]\n{text}\n")
    assert caught.value.path == path
    assert words in caught.value.reason


def test_environment_overrides_and_a_working_short_set() -> None:
    kube = load_text("[kubernetes]\nlease_duration_s = 4\nrenew_deadline_s = 3\n",
                     environ={"SUPERVISOR_KUBERNETES__RETRY_PERIOD_S": "0.5",
                              "SUPERVISOR_KUBERNETES__LEADER_ELECTION": "false",
                              "SUPERVISOR_KUBERNETES__IDENTITY": "vm-1"}).kubernetes
    assert (kube.retry_period_s, kube.leader_election, kube.identity) == (0.5, False, "vm-1")
