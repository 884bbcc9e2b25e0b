"""An effect's service options, stated once, and their rules, checked in one place.

Every way of declaring an effect (``Effect``, ``@effect``, ``http_effect``,
``async_http_effect``, the AWS, SMTP and NATS builders, the MCP proxy's tools file) takes the
same keyword options (:class:`EffectOptions`, so a type checker catches a misspelled one) and
turns them, with an optional :class:`intentlog.Service`, into one checked
:class:`EffectContract` by :func:`effect_contract`. Each cross-field rule, and the text of its
error, is written here only:

- ``idempotent=True`` needs a stated ``key_retention`` (a retention left unstated is never
  taken as forever: a resend after the service forgot the key applies twice);
- ``key_retention`` and ``locks_in_flight`` apply only to a service that deduplicates;
- a retention of :data:`intentlog.PROCESS` (keys lost with the service's process) does not
  deduplicate across a crash;
- with a ``service``, only ``timeout`` may be given beside it: every other promise has one
  value, the service's;
- a service's unknown lookup lag is taken as the request timeout (the safe side).

Each error is an InvalidInput whose ``option`` attribute names the option at fault.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from intentlog._errors import InvalidInput
from intentlog._service import FOREVER, PROCESS, Retention, Seconds, Service
from intentlog._validate import seconds

__all__ = [
    "FIXED",
    "PYTHON",
    "EffectContract",
    "EffectOptions",
    "Spelling",
    "check_names",
    "effect_contract",
    "unstated_retention",
]


class EffectOptions(TypedDict, total=False):
    """What an effect's service promises, as keyword options: the same names and types at
    every entry point (``**options: Unpack[EffectOptions]``). A name left out, or given as
    None, is not stated.

    - ``idempotent``: the service deduplicates on the operation key;
    - ``key_retention``: for how long (seconds, a timedelta, or ``intentlog.FOREVER`` written
      out); required with ``idempotent=True``, refused without it;
    - ``timeout``: the request deadline, after which a request cannot land any more;
    - ``lookup_lag``: how far the service's lookup may lag behind a commit;
    - ``locks_in_flight``: the service refuses a same-key request while the first one runs
      (only for a service that deduplicates).
    """

    idempotent: bool | None
    key_retention: Seconds | Retention | None
    timeout: Seconds | None
    lookup_lag: Seconds | None
    locks_in_flight: bool | None


NAMES: tuple[str, ...] = tuple(EffectOptions.__annotations__)


@dataclasses.dataclass(frozen=True, slots=True)
class EffectContract:
    """The checked promises of one effect's service.

    ``key_retention`` is :data:`intentlog.FOREVER` or seconds for an effect that deduplicates
    and None otherwise. ``timeout`` is the stated one, else the service's, else the entry
    point's default. ``lookup_lag`` is the stated one, else the service's (its unknown lag
    taken as ``timeout``), else None: not stated, for the entry point to default.
    """

    service: Service | None
    idempotent: bool
    key_retention: float | Retention | None
    timeout: float
    lookup_lag: float | None
    locks_in_flight: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Spelling:
    """How an entry point writes the options, so that an error shows the fix in the words the
    user wrote (Python keywords, or the fields of the MCP proxy's tools file)."""

    names: Mapping[str, str] = dataclasses.field(default_factory=dict)  # option -> as written
    assign: str = "{name}={value}"
    true: str = "True"
    false: str = "False"
    forever: str = "intentlog.FOREVER"
    process: str = "intentlog.PROCESS"
    durations: str = "seconds or a timedelta"
    profile: str = "service=intentlog.profiles.X"
    profile_name: Callable[[str], str] = "profiles.{}".format
    override: str = "declare them there (service.replace(...)), not on the effect"

    def name(self, option: str) -> str:
        return self.names.get(option, option)

    def set(self, option: str, value: str) -> str:
        return self.assign.format(name=self.name(option), value=value)


#: The spelling of Python keyword arguments (``Effect``, ``@effect``, ``http_effect``).
PYTHON = Spelling()
#: For a builder whose service is its own (AWS, SMTP, NATS): there is no service to change.
FIXED = Spelling(override="the builder states its service's contract; only timeout may be given")


def check_names(options: Mapping[str, Any], caller: str) -> None:
    """TypeError for a name that is no effect option, as Python raises for any unexpected
    keyword argument (naming it, ``caller``, and the options there are)."""
    unknown = [name for name in options if name not in NAMES]
    if unknown:
        raise TypeError(
            f"{caller}() got an unexpected keyword argument {unknown[0]!r}; "
            f"the effect options are {', '.join(NAMES)}"
        )


def effect_contract(
    what: str,
    options: Mapping[str, Any],
    service: Service | None = None,
    *,
    caller: str,
    default_timeout: float = 30.0,
    declared: Mapping[str, object] | None = None,
    spelling: Spelling = PYTHON,
) -> EffectContract:
    """The checked contract of the effect ``what`` (``"effect 'charge'"``, the subject of
    every message) from its ``options`` and ``service``: the one place of their rules.

    ``caller`` names the entry point for an unknown option (TypeError). ``declared``: the
    entry point's own keywords that a service declares too (an HTTP effect's ``replay`` and
    ``key_header``), refused beside a service like the options (None values are not given).
    ``spelling`` words the messages. Raises InvalidInput naming the option (``option=``).
    """
    check_names(options, caller)
    given = {name: value for name, value in options.items() if value is not None}
    timeout = _stated_seconds(given, "timeout", positive=True)
    if service is not None:
        if not isinstance(service, Service):
            raise InvalidInput(
                f"{what}: service must be an intentlog.Service, got {service!r}", option="service"
            )
        # The request deadline may be shorter or longer per effect; every other promise is
        # the service's, stated once there.
        overrides = [name for name in NAMES if name in given and name != "timeout"]
        overrides += [name for name, value in (declared or {}).items() if value is not None]
        if overrides:
            raise InvalidInput(
                f"{what}: {', '.join(spelling.name(n) for n in overrides)} come from service "
                f"{service.name!r}; {spelling.override}",
                option=overrides[0],
            )
        wait = timeout if timeout is not None else service.timeout
        deduplicates = service.deduplicates
        # A service deduplicates only with a stated retention (a duration or FOREVER).
        return EffectContract(
            service=service,
            idempotent=deduplicates,
            key_retention=service.retention if deduplicates else None,
            timeout=wait,
            # A service whose lookup lag is unknown lags as long as a request may take.
            lookup_lag=service.lookup_lag if service.lookup_lag is not None else wait,
            locks_in_flight=service.locks_in_flight and deduplicates,
        )
    idempotent = _flag(what, given, "idempotent", spelling)
    locks = _flag(what, given, "locks_in_flight", spelling)
    retention = given.get("key_retention")
    if retention is not None and not idempotent:
        raise InvalidInput(
            f"{what}: {spelling.name('key_retention')} only applies to a service that "
            f"deduplicates; {_as_well(spelling)}",
            option="key_retention",
        )
    if idempotent and retention is None:
        raise unstated_retention(what, spelling=spelling)
    if retention is PROCESS:
        raise InvalidInput(
            f"{what}: {spelling.set('key_retention', spelling.process)} (keys lost when the "
            "service's process ends) does not deduplicate across a crash; leave "
            f"{spelling.set('idempotent', spelling.false)}",
            option="key_retention",
        )
    if locks and not idempotent:
        raise InvalidInput(
            f"{what}: {spelling.name('locks_in_flight')} only applies to a service that "
            f"deduplicates; {_as_well(spelling)}",
            option="locks_in_flight",
        )
    kept: float | Retention | None = (
        retention
        if retention is FOREVER
        else _stated_seconds(given, "key_retention", positive=True)
    )
    lag = _stated_seconds(given, "lookup_lag", positive=False)
    return EffectContract(
        service=None,
        idempotent=idempotent,
        key_retention=kept,
        timeout=timeout if timeout is not None else default_timeout,
        lookup_lag=lag,
        locks_in_flight=locks,
    )


def _stated_seconds(given: Mapping[str, Any], option: str, *, positive: bool) -> float | None:
    """The option as seconds, or None where it is not stated."""
    value = given.get(option)
    return None if value is None else seconds(option, value, positive=positive, bounded=False)


def _flag(what: str, given: Mapping[str, Any], option: str, spelling: Spelling) -> bool:
    value = given.get(option, False)
    if type(value) is not bool:
        raise InvalidInput(
            f"{what}: {spelling.name(option)} must be {spelling.true} or {spelling.false}, "
            f"got {value!r}",
            option=option,
        )
    return value


def _as_well(spelling: Spelling) -> str:
    return f"pass {spelling.set('idempotent', spelling.true)} as well"


def unstated_retention(
    what: str, option: str = "key_retention", *, spelling: Spelling = PYTHON
) -> InvalidInput:
    """The error for deduplication declared without its retention: it names ``option``,
    says how to write forever, and names the profiles that know the figure."""
    from intentlog import profiles  # only when needed: `import intentlog` loads no profile

    known = [
        spelling.profile_name(name)
        for name in profiles.__all__
        if isinstance(getattr(profiles, name), Service) and getattr(profiles, name).deduplicates
    ]
    if spelling is PYTHON or spelling is FIXED:
        known.append("profiles.nats_jetstream(window)")
    stated = spelling.name(option)
    return InvalidInput(
        f"{what}: {spelling.set('idempotent', spelling.true)} needs {stated} too: how long "
        f"the service honours a key ({spelling.durations}). A retention left unstated is never "
        f"taken as forever; write {spelling.set(option, spelling.forever)} where the service "
        "really keeps keys forever, or use a profile that knows the figure, "
        f"{spelling.profile} ({', '.join(known)})",
        option=option,
    )
