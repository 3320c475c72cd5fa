"""Options parsed and validated in one place.

Spark hands a sink its options as a case-insensitive string map (keys arrive lower-cased). Each sink
declares its options as :class:`Option` objects; :func:`parse_options` rejects unknown keys, converts
values, applies defaults and reports every problem as a :class:`~twophase.errors.ConfigurationError`
that names the option and the fix. Options every twophase sink takes are in :data:`COMMON_OPTIONS`.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Mapping, Optional, Sequence, TypeVar

from twophase._redact import MASK, is_secret_name, redact_text, redact_values
from twophase.errors import ConfigurationError

T = TypeVar("T")

#: keys Spark itself adds to a sink's options; accepted and passed through untouched
SPARK_KEYS = frozenset({"checkpointlocation", "queryname", "__partition_columns"})


@dataclass(frozen=True)
class Option(Generic[T]):
    """One option: its key (as users spell it), how to parse it, its default, and a line of help."""

    key: str
    parse: Callable[[str], T]
    default: Optional[T] = None
    required: bool = False
    help: str = ""

    @property
    def lookup_key(self) -> str:
        return self.key.lower()


def parse_bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


def parse_positive_int(v: str) -> int:
    n = int(str(v).strip())
    if n <= 0:
        raise ValueError("must be > 0")
    return n


def parse_size(v: str) -> int:
    """Bytes, with an optional k/m/g suffix (binary): '128m' -> 134217728."""
    s = str(v).strip().lower().removesuffix("b").removesuffix("i")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    n = int(float(s[:-1] if mult > 1 else s) * mult)
    if n <= 0:
        raise ValueError("must be > 0")
    return n


def parse_duration_ms(v: str) -> int:
    """'500' (ms), '10s', '10 seconds', '2 minutes', '1m', '250ms', '1h' -> milliseconds (> 0)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)?",
                     str(v).strip().lower())
    if not m:
        raise ValueError("expected a duration such as '10 seconds' or '500ms'")
    unit = m.group(2) or "ms"
    mult = 1 if unit.startswith("ms") or unit.startswith("milli") else 1000 if unit.startswith("s") else \
        60_000 if unit.startswith("m") else 3_600_000
    n = int(float(m.group(1)) * mult)
    if n <= 0:
        raise ValueError("must be > 0")
    return n


def parse_list(v: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in str(v).split(",") if x.strip())


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        s = str(v).strip().lower()
        if s not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return s
    return parse


COMMON_OPTIONS: tuple[Option[Any], ...] = (
    Option("sink.id", str, help="stable id of this sink; its transaction log is keyed by it"),
    Option("guarantee", parse_choice("exactly-once", "at-least-once"), "exactly-once",
           help="exactly-once (two-phase commit) or at-least-once (direct writes, duplicates on replay)"),
    Option("log.location", str, help="where the sink's transaction log lives (default: chosen by the sink)"),
    Option("log.retain", parse_positive_int, 100, help="how many finished checkpoint records to keep (>= 2)"),
)


def _shown(key: str, value: Any) -> str:
    """How an option's value appears in an error message: masked when the option is secret."""
    return MASK if is_secret_name(key) else redact_text(repr(value))


def parse_options(raw: Mapping[str, Any], declared: Sequence[Option[Any]], *, sink: str,
                  prefixes: Iterable[str] = ()) -> dict[str, Any]:
    """Validate ``raw`` against ``declared`` (plus :data:`COMMON_OPTIONS`); return ``{key: value}``.

    Keys starting with any of ``prefixes`` (e.g. ``kafka.``) are passed through as strings under
    their original key. Unknown keys are an error that lists the known ones.
    """
    specs = {o.lookup_key: o for o in (*COMMON_OPTIONS, *declared)}
    prefixes = tuple(p.lower() for p in prefixes)
    lowered: dict[str, Any] = {}
    for k, v in raw.items():
        lk = str(k).lower()
        if lk in lowered:
            raise ConfigurationError(f"{sink}: option {k!r} given twice (option keys are case-insensitive)")
        lowered[lk] = v
    unknown = [k for k in lowered if k not in specs and k not in SPARK_KEYS and not k.startswith(prefixes)]
    if unknown:
        known = ", ".join(sorted(o.key for o in specs.values()))
        raise ConfigurationError(f"{sink}: unknown option(s) {', '.join(repr(u) for u in sorted(unknown))}; "
                                 f"known options are: {known}" + (f" and any {'/'.join(prefixes)}*" if prefixes else ""))
    out: dict[str, Any] = {}
    for lk, spec in specs.items():
        if lk in lowered and lowered[lk] is not None and str(lowered[lk]) != "":
            try:
                out[spec.key] = spec.parse(lowered[lk])
            except (ValueError, TypeError) as e:
                raise ConfigurationError(f"{sink}: option {spec.key!r}={_shown(spec.key, lowered[lk])} is invalid: "
                                         f"{redact_values(redact_text(str(e)), [lowered[lk]]) if is_secret_name(spec.key) else redact_text(str(e))}"
                                         + (f" ({spec.help})" if spec.help else "")) from None
        elif spec.required:
            raise ConfigurationError(f"{sink}: option {spec.key!r} is required" + (f": {spec.help}" if spec.help else ""))
        else:
            out[spec.key] = spec.default
    for lk, v in lowered.items():
        if lk.startswith(prefixes):
            out[lk] = v
    out["checkpointlocation"] = lowered.get("checkpointlocation")
    return out
