"""Properties: whatever the input, decode and compile answer a Snapshot or a RevisionError."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from supervisor import reasons
from supervisor.revision import (
    EnvFileResolver,
    RevisionError,
    Snapshot,
    compile_revision,
    decode_body,
    encode_document,
)
from supervisor.revision.document import document_from_object

COMPILE_REASONS = {
    reasons.CORRUPT,
    reasons.INCOMPATIBLE,
    reasons.VALIDATION,
    reasons.PROJECTION,
    reasons.SECRET,
    reasons.SNAPSHOT,
}
SECRETS = {"A": "secret-value-aaaa-1111", "B": "secret-value-bbbb-2222", "EMPTY": ""}
DIGESTS = {hashlib.sha256(v.encode()).hexdigest() for v in SECRETS.values() if v}

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=24,
)

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,6}", fullmatch=True) | st.text(max_size=4)
good_names = st.sampled_from(["chat", "embed", "v1.chat", "a_b", "x-1"])
upstreams = st.sampled_from(
    [
        "https://llm.internal:8443/v1",
        "http://127.0.0.1",
        "http://[::1]:80/",
        "https://x:65536",
        "ftp://x",
        "https://u:p@x",
        "",
    ]
) | st.text(max_size=20)
alias_specs = st.fixed_dictionaries(
    {"upstream": upstreams},
    optional={
        "timeout_s": st.sampled_from([30, 0.5, 0, -1, 86_401, "30"]) | json_values,
        "retries": st.integers(-2, 12) | json_values,
        "unknown": json_values,
    },
)
key_specs = st.fixed_dictionaries(
    {
        "secret": st.sampled_from(
            ["env:A", "env:B", "env:EMPTY", "env:MISSING", "file:/nonexistent/x", "nope", "env:"]
        ),
        "aliases": st.lists(good_names | names, max_size=3),
    },
    optional={"unknown": json_values},
)
documents = st.fixed_dictionaries(
    {"schema_version": st.sampled_from([1, 1, 1, 1, 2, 0, "1", True, 1.0])},
    optional={
        "aliases": st.dictionaries(good_names | names, alias_specs, max_size=4) | json_values,
        "keys": st.dictionaries(good_names | names, key_specs, max_size=4) | json_values,
        "extra": json_values,
    },
)


def outcome(raw: bytes) -> Snapshot | RevisionError:
    try:
        return compile_revision(raw, revision=5, generation=2, resolver=EnvFileResolver(SECRETS))
    except RevisionError as exc:
        return exc


def no_secret_in(error: RevisionError) -> bool:
    return not any(v and v in str(error) for v in SECRETS.values())


@PROPERTY
@given(st.binary(max_size=256))
def test_arbitrary_bytes_only_raise_revision_errors(raw: bytes) -> None:
    result = outcome(raw)
    if isinstance(result, RevisionError):
        assert result.reason in COMPILE_REASONS and result.revision == 5
    try:
        decode_body(raw)
    except RevisionError:
        pass


@PROPERTY
@given(json_values)
def test_arbitrary_json_only_raises_revision_errors(value: Any) -> None:
    result = outcome(json.dumps(value).encode())
    if not isinstance(value, dict):  # JSON, but not a document's shape
        assert isinstance(result, RevisionError) and result.reason == reasons.VALIDATION
    elif isinstance(result, RevisionError):
        assert result.reason in COMPILE_REASONS


@PROPERTY
@given(documents)
def test_document_shaped_values_get_a_reasoned_answer(value: dict[str, Any]) -> None:
    result = outcome(json.dumps(value).encode())
    version = value["schema_version"]
    if isinstance(result, Snapshot):
        assert version == 1 and type(version) is int
        snapshot = json.loads(result.to_json())
        assert set(snapshot) == {"revision", "generation", "aliases", "keys"}
        for key in snapshot["keys"].values():
            assert key["digest"] in DIGESTS
            assert set(key["aliases"]) <= set(snapshot["aliases"])
        return
    assert result.reason in COMPILE_REASONS
    assert no_secret_in(result)
    if type(version) is int and version == 2:
        assert result.reason == reasons.INCOMPATIBLE
    elif version != 1 or type(version) is not int:
        assert result.reason == reasons.VALIDATION
        assert result.detail.startswith("$.schema_version: ")
    if result.reason == reasons.VALIDATION:
        assert result.detail.startswith("$"), result.detail


@PROPERTY
@given(documents)
def test_file_path_and_body_path_agree(value: dict[str, Any]) -> None:
    """TOML files validate by conversion, bodies by typed decode: same verdicts."""
    raw = json.dumps(value).encode()
    try:
        from_body: Any = decode_body(raw)
    except RevisionError as exc:
        from_body = (exc.reason, exc.detail)
    try:
        from_object: Any = document_from_object(json.loads(raw))
    except RevisionError as exc:
        from_object = (exc.reason, exc.detail)
    assert from_body == from_object


valid_documents = st.fixed_dictionaries(
    {
        "schema_version": st.just(1),
        "aliases": st.dictionaries(
            st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
            st.fixed_dictionaries(
                {"upstream": st.sampled_from(["https://a.example/v1", "http://[::1]:8080"])},
                optional={
                    "timeout_s": st.floats(min_value=0.001, max_value=86_400),
                    "retries": st.integers(0, 10),
                },
            ),
            min_size=1,
            max_size=6,
        ),
    }
)


@PROPERTY
@given(valid_documents, st.data())
def test_valid_documents_compile_to_exactly_their_content(
    value: dict[str, Any], data: st.DataObject
) -> None:
    alias_names = sorted(value["aliases"])
    secrets = data.draw(st.lists(st.binary(min_size=1, max_size=16), unique=True, max_size=4))
    environ = {f"K{i}": s.hex() for i, s in enumerate(secrets)}
    value["keys"] = {
        f"key-{i}": {
            "secret": f"env:K{i}",
            "aliases": data.draw(
                st.lists(st.sampled_from(alias_names), min_size=1, max_size=3, unique=True)
            ),
        }
        for i in range(len(secrets))
    }
    raw = json.dumps(value).encode()
    snapshot = compile_revision(raw, revision=1, generation=9, resolver=EnvFileResolver(environ))
    expected_aliases = {
        name: {
            "upstream": spec["upstream"],
            "timeout_s": float(spec.get("timeout_s", 30.0)),
            "retries": spec.get("retries", 2),
        }
        for name, spec in value["aliases"].items()
    }
    expected_keys = {
        name: {
            "digest": hashlib.sha256(environ[spec["secret"][4:]].encode()).hexdigest(),
            "aliases": spec["aliases"],
        }
        for name, spec in value["keys"].items()
    }
    assert json.loads(snapshot.to_json()) == {
        "revision": 1,
        "generation": 9,
        "aliases": expected_aliases,
        "keys": expected_keys,
    }
    # The canonical form is stable.
    canonical = encode_document(decode_body(raw))
    assert encode_document(decode_body(canonical)) == canonical


@PROPERTY
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_timeout_must_be_a_finite_positive_number(timeout: float) -> None:
    assume(not math.isnan(timeout))  # JSON has no NaN
    raw = msgspec.json.encode(
        {"schema_version": 1, "aliases": {"a": {"upstream": "http://h", "timeout_s": timeout}}}
    )
    result = outcome(raw)
    if 0 < timeout <= 86_400:
        assert isinstance(result, Snapshot) and result.aliases["a"].timeout_s == timeout
    else:
        assert isinstance(result, RevisionError) and result.reason == reasons.VALIDATION
