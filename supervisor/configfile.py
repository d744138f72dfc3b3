"""Reading a configuration: TOML text, environment overrides, errors that name the key.

Operators: docs/configuration.md. The schema is :mod:`supervisor.config`.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import msgspec.inspect

from supervisor.config import CONFIG_ENV, ENV_PREFIX, Config
from supervisor.configchecks import cross_check
from supervisor.errors import ConfigError

__all__ = ["all_problems", "did_you_mean", "env_warnings", "load", "load_text"]


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (ValueError, RecursionError):
        # Not a TOML value (TOMLDecodeError is a ValueError; so is an integer
        # of too many digits; RecursionError is nesting): a plain string.
        return text


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str],
               origins: dict[str, str]) -> dict[str, Any]:
    """``raw`` with the environment's overrides; ``origins`` gets ``$.section.key`` -> the
    variable that set it, so an error about that key blames the variable, not the file.

    A value is parsed as TOML when it parses: ``["a", "b"]`` a list, ``2.5`` a float. Else
    it is a string, so ``postgresql://...`` needs no quotes. msgspec's lax conversion then
    makes ``"true"`` or ``"5"`` the declared type. A name or value that is not UTF-8 (lone
    surrogates in ``os.environ``) is refused.
    """
    sections = set(Config.__struct_fields__)
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name or name == CONFIG_ENV:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        section, key = section.lower(), key.lower()
        if not _is_utf8(name):
            where = f"$.{section}" if _is_utf8(section) else "$"
            raise ConfigError(where, f"the environment variable {name!a} is not UTF-8")
        if section not in sections:
            raise ConfigError(f"$.{section}", f"unknown section (from environment {name})"
                              + _did_you_mean("$", section))
        if not _is_utf8(value):
            raise ConfigError(f"$.{section}.{key}",
                              f"the environment variable {name} is not valid UTF-8")
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"$.{section}", "expected a table")
        table[key] = _env_value(value)
        origins[f"$.{section}.{key}"] = name
    return raw


def env_warnings(environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(variable, warning) for each ``SUPERVISOR_`` variable not read that nearly names a key.

    Nearly: ``__`` missing between section and key (``SUPERVISOR_CONTROL_PLANE_URL`` for
    ``SUPERVISOR_CONTROL_PLANE__URL``). Ignored, as any unknown variable, but said.
    """
    found: list[tuple[str, str]] = []
    sections = {f.name: f.type for f in msgspec.structs.fields(Config)}
    for name in sorted(os.environ if environ is None else environ):
        rest = name[len(ENV_PREFIX):].lower() if name.startswith(ENV_PREFIX) else ""
        if not rest or "__" in name or name == CONFIG_ENV:
            continue
        for section, spec in sections.items():
            key = rest.removeprefix(f"{section}_")
            if key != rest and key in getattr(spec, "__struct_fields__", ()):
                right = f"{ENV_PREFIX}{section.upper()}__{key.upper()}"
                found.append((name, f"the environment variable {name} is not read: did you "
                                    f"mean {right}?"))
    return found


def load_text(
    text: str, *, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> Config:
    """Parse TOML text, apply environment overrides, validate. Raises ConfigError, only.

    Unknown keys are errors. Every key can be overridden as ``SUPERVISOR_<SECTION>__<KEY>``.
    An error names the bad key's JSON path and the reason; the CLI exits 2.
    Input that breaks the parser (nesting past the recursion limit, an integer too long
    to convert, text not UTF-8) is a ConfigError like any other.
    """
    origins: dict[str, str] = {}
    try:
        raw = _apply_env(_parse_toml(text), os.environ if environ is None else environ, origins)
        config = _convert(raw)
        cross_check(config)
    except ConfigError as exc:
        _blame(exc, source, origins)
        raise
    except (RecursionError, ValueError, UnicodeError) as exc:
        # The safety net: anything above that a hostile input can still make
        # the parser or converter raise is a bad configuration, not a crash.
        raise ConfigError("$", f"cannot be parsed: {exc}", source=source) from None
    return config


def _convert(raw: dict[str, Any]) -> Config:
    """``raw`` as a Config (values unusable anywhere refused first); ConfigError else."""
    _refuse_unusable_values(raw)
    try:
        return msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(*_explain(str(exc), raw)) from exc


def _blame(exc: ConfigError, source: str, origins: Mapping[str, str]) -> ConfigError:
    """Name where the bad value came from: the environment variable that set the key,
    else the file."""
    variable = next((name for key, name in origins.items()
                     if exc.path == key or exc.path.startswith((f"{key}.", f"{key}["))), None)
    exc.source = source if variable is None else f"environment variable {variable}"
    exc.args = (f"{exc.source}: {exc.path}: {exc.reason}",)
    return exc


def all_problems(path: str | os.PathLike[str], *,
                 environ: Mapping[str, str] | None = None) -> list[ConfigError]:
    """Every problem :func:`load` would refuse, not only the first (``check``).

    msgspec stops at a document's first error. So each key of each section is converted
    on its own (every key has a default). The rules between keys
    (:func:`~supervisor.configchecks.cross_check`) are judged only when every key is
    valid, and report their first problem.
    """
    try:
        load(path, environ=environ)
    except ConfigError as exc:
        first = exc
    else:
        return []
    source, origins = str(path), dict[str, str]()
    try:
        raw = _parse_toml(read_config_text(path))
        raw = _apply_env(raw, os.environ if environ is None else environ, origins)
    except (ConfigError, OSError, ValueError, RecursionError):
        return [first]  # nothing to split into keys: the one problem there is
    problems: list[ConfigError] = []
    valid: dict[str, Any] = {}
    for section, table in raw.items():
        pieces = table.items() if isinstance(table, dict) and table else [(None, table)]
        for key, value in pieces:
            piece = {section: value if key is None else {key: value}}
            try:
                _convert(piece)
            except ConfigError as exc:
                problems.append(_blame(exc, source, origins))
            except (RecursionError, ValueError, UnicodeError):
                problems.append(first)
            else:
                if key is None:
                    valid[section] = value
                else:
                    valid.setdefault(section, {})[key] = value
    if problems:
        # The rules judged after conversion ([admin].listen's HOST:PORT ...) over the keys
        # that are valid: the first one, unless it names a key already reported (its
        # default then stands in for the bad value, which may be what the rule missed).
        try:
            cross_check(msgspec.convert(valid, Config, strict=False))
        except ConfigError as exc:
            if not any(exc.path == p.path or exc.path.startswith(f"{p.path}.")
                       for p in problems):
                problems.append(_blame(exc, source, origins))
        except (msgspec.ValidationError, RecursionError, ValueError, UnicodeError):
            pass  # each key converted on its own: not expected together either
    return problems or [first]


def _parse_toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("$", f"not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(
            "$", "not valid TOML here: arrays or inline tables nested too deeply") from None
    except ValueError as exc:
        # tomllib converts integers with int(): past sys.get_int_max_str_digits()
        # (4300) digits that raises ValueError. Say where, in the file's terms.
        long_number = re.search(f"[0-9_]{{{_MAX_INT_DIGITS},}}", text)
        if long_number is None:
            raise ConfigError("$", f"not valid TOML: {exc}") from None
        line = text.count("\n", 0, long_number.start()) + 1
        raise ConfigError(
            "$", f"not valid TOML here: an integer at line {line} has more than "
            f"{_MAX_INT_DIGITS} digits"
        ) from None


_MAX_INT_DIGITS: Final = 4300  # CPython's default int max str digits


def _refuse_unusable_values(raw: dict[str, Any]) -> None:
    """inf, nan and NUL characters are meaningless in every key: refuse them with their path."""
    stack: list[tuple[str, Any]] = [("$", raw)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((_member(path, str(k)), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(path, f"must be a finite number, got {value}")
        elif isinstance(value, str) and "\x00" in value:
            raise ConfigError(path, "contains a NUL character")


def _member(parent: str, name: str) -> str:
    return f"{parent}.{name}" if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f"{parent}[{name!r}]"


#: The largest configuration file read. A real one is a few KiB; anything
#: near this is not a configuration (a runaway template, a log written to the
#: path), and parsing it whole would hold the interpreter for seconds (a
#: SIGHUP re-read abandoned at its deadline would go on parsing in its thread).
MAX_CONFIG_BYTES: Final = 1024 * 1024


def read_config_text(path: str | os.PathLike[str]) -> str:
    """The file's text, at most :data:`MAX_CONFIG_BYTES` of it read. Raises ConfigError."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError("$", f"larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB: "
                                   "not a configuration file", source=str(path))
        # Newlines as text mode reads them (what the parser was always given).
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("$", f"cannot read: {exc}", source=str(path)) from exc


def load(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate the configuration file at ``path``. Raises ConfigError."""
    return load_text(read_config_text(path), source=str(path), environ=environ)


def _explain(message: str, raw: dict[str, Any]) -> tuple[str, str]:
    """(path, reason) for a msgspec error; a bound error names the whole allowed range."""
    path, reason = _split_msgspec_error(message)
    bounds = _bounds_of(path)
    if bounds and re.fullmatch(r"Expected `(float|int)` [<>]=? \S+", reason):
        reason = f"must be {bounds}, got {_raw_value(raw, path)!r}"
    choices = _choices_of(path)
    if choices and reason.startswith("Invalid enum value"):
        reason = f"must be one of {', '.join(choices)}, got {_raw_value(raw, path)!r}"
    return path, reason


def _type_at(path: str) -> Any:
    """The declared msgspec type of the key at ``$.section.key`` (None: not a plain key)."""
    info: Any = msgspec.inspect.type_info(Config)
    for name in path.split(".")[1:]:
        if not isinstance(info, msgspec.inspect.StructType):
            return None
        field = next((f for f in info.fields if f.name == name), None)
        if field is None:
            return None
        info = field.type
    return info


def _choices_of(path: str) -> list[str]:
    """The values a Literal (enum) key accepts, in declaration order."""
    info = _type_at(path)
    if isinstance(info, msgspec.inspect.UnionType):  # `Literal[...] | None`
        info = next((t for t in info.types if isinstance(t, msgspec.inspect.LiteralType)),
                    None)
    if not isinstance(info, msgspec.inspect.LiteralType):
        return []
    return [str(v) for v in info.values]


def _bounds_of(path: str) -> str | None:
    """``">= 0.01 and <= 86400"`` for a numeric field with bounds, from its declared type."""
    info = _type_at(path)
    if not isinstance(info, msgspec.inspect.FloatType | msgspec.inspect.IntType):
        return None
    parts = [f"{op} {bound:g}" for op, bound in (
        (">=", info.ge), (">", info.gt), ("<=", info.le), ("<", info.lt)) if bound is not None]
    return " and ".join(parts) or None


def _raw_value(raw: dict[str, Any], path: str) -> Any:
    value: Any = raw
    for name in path.split(".")[1:]:
        value = value.get(name) if isinstance(value, dict) else None
    return value


def _split_msgspec_error(message: str) -> tuple[str, str]:
    # msgspec says "Object contains unknown field `x` - at `$.log`"
    # or "Expected `int`, got `str` - at `$.a.b`".
    reason, sep, where = message.rpartition(" - at `")
    if sep:
        path = where.rstrip("`")
    else:
        reason, path = message, "$"
    if reason.startswith("Object contains unknown field `"):
        field = reason.split("`")[1]
        return f"{path}.{field}", "unknown key" + _did_you_mean(path, field)
    return path, reason


def _did_you_mean(path: str, field: str) -> str:
    """`` (did you mean `x`?)`` for the closest known key at ``path``, or ``""``."""
    info = _type_at(path)
    return did_you_mean(field, [f.name for f in info.fields]
                        if isinstance(info, msgspec.inspect.StructType) else [])


def did_you_mean(word: str, known: list[str]) -> str:
    """`` (did you mean `x`?)`` for the closest of ``known`` to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""
