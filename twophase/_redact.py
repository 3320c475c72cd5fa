"""Secrets never leave the process in text: the one place that decides what is secret and masks it.

Secrets (S3 keys, Azure account keys, SAS tokens and connection strings, SASL / SSL passwords, session
tokens, JAAS configs, OAUTHBEARER client secrets and access tokens) must appear in no log line,
error message, ``repr``, transaction log record or ``twophase log inspect`` output. Everything that
turns options or configuration into text goes through this module:

- :func:`is_secret_name`: is an option / field / setting name secret? Case-insensitive, ``.``/``_``/``-``
  ignored, so ``s3.secretAccessKey``, ``secret_access_key``, ``AWS_SECRET_ACCESS_KEY``,
  ``kafka.sasl.jaas.config``, ``sasl_plain_password``, ``ssl.key.password`` all match. A name is secret
  when it contains one of :data:`SECRET_WORDS`, unless it is one of :data:`NOT_SECRET` (``sink_token``
  is the sink's naming digest, :func:`twophase.sink.sink_token`, public by design).
- :func:`redact_value` ``(name, value)``: ``***`` for a secret name, else the value with secrets
  embedded in text masked (:func:`redact_text`: ``password="..."`` in a JAAS config, ``user:pass@`` in
  a URL, ``token=...`` in a query string, a JSON Web Token, an ``Authorization:`` header's credentials); mappings and sequences are redacted recursively.
- :func:`redact_mapping`: a copy of a mapping with every secret-named value masked (recursively).
- :func:`redact_json`: only the text patterns, keys untouched: for data keyed by user names (topics,
  task ids), where a topic called ``tokens`` must not lose its offsets.
- :func:`safe_repr`: a class decorator (put it above ``@dataclass``) whose ``__repr__`` masks secret
  fields. The objects still carry the secrets (a pickled sink needs them on the executors); only their
  text forms do not.

Values are masked whole (``***``), never partially: a prefix of a key is still a key.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, TypeVar

#: what a secret is shown as
MASK = "***"

#: a name containing one of these (after lower-casing and dropping ``.``, ``_``, ``-``) is secret
SECRET_WORDS = ("password", "passwd", "secret", "token", "jaas", "credential", "privatekey", "accountkey",
                "sharedkey", "apikey", "signature", "sastoken", "connectionstring")

#: names that contain a secret word but are not secrets (normalised like :data:`SECRET_WORDS`)
NOT_SECRET = frozenset({
    "sinktoken",  # twophase.sink.sink_token: a digest of the sink id that names its files, public by design
})

_NORMALISE = re.compile(r"[._\-\s]")


def _normal(name: Any) -> str:
    return _NORMALISE.sub("", str(name).lower())


def is_secret_name(name: Any) -> bool:
    """True when an option, field or setting called ``name`` holds a secret (see module doc)."""
    n = _normal(name)
    return n not in NOT_SECRET and any(w in n for w in SECRET_WORDS)


# key=value / key: value / "key": "value" where key contains a secret word (JAAS configs, query
# strings, JSON text); only such keys are matched, so a non-secret pair never swallows a secret one
_WORD_RE = "|".join("[._-]?".join(map(re.escape, w)) for w in SECRET_WORDS)
_KEY_VALUE = re.compile(
    rf"""(?P<key>[A-Za-z0-9_.\-]*(?:{_WORD_RE})[A-Za-z0-9_.\-]*)(?P<q>["']?)(?P<sep>\s*[=:]\s*)"""
    r"""(?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s;,&"'}\]]+)""", re.IGNORECASE)
# the signature of an Azure SAS token in a URL's query or a bare token (``sv=...&sig=<base64>``)
_SAS_SIG = re.compile(r"(?P<pre>(?:^|[?&;\s\"'])sig=)(?P<sig>[^&\s;\"']+)", re.IGNORECASE)
# scheme://user:password@host (the password may contain '/': AWS secret keys do)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^/\s:@]*):(?P<pw>[^\s@]+)@")


# libpq's password settings (``password``, ``sslpassword``; twophase-postgres's option 'url'): in a URI's query
# string the value ends at '&' or '#'; in a key=value conninfo an unquoted value ends only at whitespace (',', ';'
# and '&' belong to it: the generic pattern below stopped there and showed the rest), a quoted one at its quote
_LIBPQ_QUERY_PW = re.compile(r"(?P<pre>[?&](?:ssl)?password=)(?P<v>[^&#\s]+)", re.IGNORECASE)
_LIBPQ_KEYWORD_PW = re.compile(r"""(?P<pre>(?<![\w.\-?&])(?:ssl)?password\s*=\s*)"""
                               r"""(?P<v>'(?:[^'\\]|\\.)*'|[^\s'"]\S*)""", re.IGNORECASE)

# a JSON Web Token (OAUTHBEARER access tokens, OIDC id tokens): three base64url parts, the first a JSON object
_JWT = re.compile(r"\beyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*")
# an HTTP Authorization header's credentials (Bearer token, Basic client id:secret) in a logged request or error
_AUTHORIZATION = re.compile(r"""(?P<pre>\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?(?:[A-Za-z][\w-]*\s+)?)"""
                            r"""(?P<cred>[^\s"',;}]+)""", re.IGNORECASE)


def _mask_key_value(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("key")):
        return m.group(0)
    v = m.group("value")
    masked = f"{v[0]}{MASK}{v[0]}" if v[:1] in ("'", '"') else MASK
    return f"{m.group('key')}{m.group('q')}{m.group('sep')}{masked}"


def redact_text(text: str) -> str:
    """``text`` with secrets embedded in it masked: ``password="..."`` (JAAS), ``secret=...``/``token=...``
    pairs (query strings, config text), ``AccountKey=...`` / ``SharedAccessSignature=...`` of Azure
    connection strings, the ``sig=`` of Azure SAS tokens and the password of ``scheme://user:password@host``
    URLs, JSON Web Tokens (OAUTHBEARER access tokens) and the credentials of an ``Authorization:`` header."""
    if not text:
        return text
    out = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{MASK}@", text)
    out = _JWT.sub(MASK, out)
    out = _AUTHORIZATION.sub(lambda m: f"{m.group('pre')}{MASK}", out)
    out = _SAS_SIG.sub(lambda m: f"{m.group('pre')}{MASK}", out)
    out = _LIBPQ_QUERY_PW.sub(lambda m: f"{m.group('pre')}{MASK}", out)
    out = _LIBPQ_KEYWORD_PW.sub(lambda m: f"{m.group('pre')}" + (f"'{MASK}'" if m.group("v")[:1] == "'" else MASK), out)
    return _KEY_VALUE.sub(_mask_key_value, out)


def redact_value(name: Any, value: Any) -> Any:
    """What may be shown of ``value`` of the option / field ``name``: :data:`MASK` for a secret name (a
    None / empty value stays as it is: whether a secret was given is not a secret), else ``value`` with
    embedded secrets masked (strings by :func:`redact_text`, mappings and sequences recursively)."""
    if is_secret_name(name):
        return value if value is None or value == "" else MASK
    return _redact_nested(value, by_name=True)


def redact_mapping(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of ``mapping`` with the value of every secret-named key masked, recursively."""
    return {k: redact_value(k, v) for k, v in mapping.items()}


def redact_json(obj: Any) -> Any:
    """``obj`` (plain data) with every string's embedded secrets masked (:func:`redact_text`); keys are not
    taken as names, so data keyed by user names (topics, task ids) keeps its values."""
    return _redact_nested(obj, by_name=False)


def _redact_nested(value: Any, *, by_name: bool) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        if by_name:
            return {k: redact_value(k, v) for k, v in value.items()}
        return {k: _redact_nested(v, by_name=False) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_redact_nested(v, by_name=by_name) for v in value)
    return value


def redact_values(text: str, secrets: Iterable[Any]) -> str:
    """``text`` with every occurrence of the given secret values replaced by :data:`MASK` (for messages
    of third-party exceptions that may echo a value, e.g. ``int('hunter2')``)."""
    for s in secrets:
        if s is not None and str(s):
            text = text.replace(str(s), MASK)
    return text


def redact_error(error: BaseException, settings: Mapping[Any, Any]) -> str:
    """``str(error)`` of a client library's exception, with embedded secrets masked and every string value
    of a secret-named setting of ``settings`` (the client's configuration) replaced by :data:`MASK`."""
    secrets = [v for k, v in settings.items() if is_secret_name(k) and isinstance(v, str)]
    return redact_values(redact_text(str(error)), secrets)


C = TypeVar("C", bound=type)


def _dataclass_repr(self: Any) -> str:
    parts = []
    for f in dataclasses.fields(self):
        if not f.repr:
            continue
        v = redact_value(f.name, getattr(self, f.name))
        parts.append(f"{f.name}={MASK if v is MASK else repr(v)}")
    return f"{type(self).__qualname__}({', '.join(parts)})"


def safe_repr(cls: C) -> C:
    """Class decorator (above ``@dataclass``): ``repr``/``str`` mask secret-named fields and secrets in
    nested mappings and strings; secret-free nested objects show their own (safe) repr."""
    cls.__repr__ = _dataclass_repr  # type: ignore[assignment]
    if "__str__" not in cls.__dict__:
        cls.__str__ = _dataclass_repr  # type: ignore[assignment]
    return cls
