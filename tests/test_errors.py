"""Every error's context is declared on its class, given as a keyword, and survives pickling."""

from __future__ import annotations

import inspect
import pickle
import typing
from typing import Any

import pytest

import intentlog
import intentlog._errors
from intentlog.integrations import AmbiguousResponse

ERRORS: list[type[intentlog.Error]] = sorted(
    {
        value
        for value in vars(intentlog).values()
        if isinstance(value, type) and issubclass(value, intentlog.Error)
    }
    | {AmbiguousResponse},
    key=lambda cls: cls.__name__,
)

# A distinct value of each declared attribute's type, so a swapped or dropped one shows.
SAMPLES: dict[Any, Any] = {
    str | None: "value",
    int | None: 418,
    float | None: 1041.5,
    tuple[str, ...] | None: ("id", "status"),
}


def keywords(cls: type[intentlog.Error]) -> list[str]:
    """The keyword-only parameters of ``cls``'s constructor."""
    return [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


def sample(cls: type[intentlog.Error], name: str) -> Any:
    value = SAMPLES[typing.get_type_hints(cls)[name]]
    return f"{name}-{value}" if isinstance(value, str) else value


def test_the_errors_are_all_here() -> None:
    names = {cls.__name__ for cls in ERRORS}
    assert names == {*intentlog._errors.__all__, "AmbiguousResponse"}


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_every_keyword_is_a_declared_typed_attribute_and_pickles(
    cls: type[intentlog.Error],
) -> None:
    # The constructor's keywords are exactly what pickling carries, each declared (annotated)
    # on the class with its default None, so a type checker sees what a user reads.
    assert sorted(keywords(cls)) == sorted(cls._context_names)
    hints = typing.get_type_hints(cls)
    for name in keywords(cls):
        assert name in hints, f"{cls.__name__}.{name} is not declared"
        assert getattr(cls("m"), name) is None, name
    context = {name: sample(cls, name) for name in keywords(cls)}
    error = cls("boom", **context)
    clone = pickle.loads(pickle.dumps(error))
    assert (type(clone), str(clone), clone.message) == (cls, "boom", "boom")
    assert {name: getattr(clone, name) for name in context} == context
    assert clone._context() == error._context() == context


@pytest.mark.parametrize(
    ("cls", "name", "value"),
    [
        (intentlog.StillInFlight, "not_before", 1041.0),
        (intentlog.UnsafeValue, "path", "state.user.password"),
        (intentlog.InvalidInput, "option", "key_retention"),
        (intentlog.InvalidInput, "path", "note"),
        (intentlog.InvalidInput, "phrase", "failed pay"),
        (intentlog.InvalidInput, "tool", "create_payment"),
        (intentlog.Rejected, "status", 400),
        (intentlog.KeyConflict, "status", 422),
        (AmbiguousResponse, "status", 503),
    ],
)
def test_the_documented_attributes(cls: type[intentlog.Error], name: str, value: Any) -> None:
    error = cls("boom", key="k", **{name: value})
    assert getattr(pickle.loads(pickle.dumps(error)), name) == value
    assert f"``{name}``" in (cls.__doc__ or ""), f"{cls.__name__}.{name} is not documented"


def test_missing_is_kept_as_a_tuple() -> None:
    error = intentlog.InvalidInput("boom", missing=["id", "status"])
    assert error.missing == ("id", "status")
    assert pickle.loads(pickle.dumps(error)).missing == ("id", "status")


def test_rejected_keeps_its_default_message_across_pickling() -> None:
    clone = pickle.loads(pickle.dumps(intentlog.Rejected(status=402)))
    assert (str(clone), clone.status) == ("rejected by the service", 402)


def test_an_undeclared_keyword_is_refused() -> None:
    # Attributes are declared, never set from arbitrary keywords: a misspelling is an error
    # (and a type error to mypy), not a silently different attribute.
    with pytest.raises(TypeError):
        intentlog.Rejected("boom", stauts=400)  # type: ignore[call-arg]
