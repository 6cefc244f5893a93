"""ttmesh's dataclasses, made without compiling code: ``from ttmesh.dataclass import dataclass``.

Python's ``dataclasses.dataclass`` writes the source of ``__init__``, ``__repr__``, ``__eq__``
(and, frozen, ``__hash__``, ``__setattr__``, ``__delattr__``) for each class and compiles it
when the class's module is imported: ~0.4 ms a class on Python 3.11, and a launch imports some
seventy, which was two fifths of its instructions. This :func:`dataclass` lets the standard
library collect the fields (so :func:`dataclasses.fields`, :func:`~dataclasses.replace`,
:func:`~dataclasses.asdict` and :func:`~dataclasses.is_dataclass` work as ever) and gives the
class the same methods made once, here, as closures over its field names.

It takes what ttmesh uses: ``frozen``, ``eq``, ``repr``; fields with a ``default`` or a
``default_factory`` and ``field(repr=False)``; ``__post_init__``. Anything else (``slots``,
``order``, ``kw_only``, ``InitVar``, ``field(init=False)``, a dataclass base) is refused at
import, pointing at :mod:`dataclasses` itself. Behaviour matches the standard library's:
positional or keyword arguments in field order, the same ``TypeError`` for a missing or
unexpected one, ``FrozenInstanceError`` on assignment to a frozen instance, equality between
instances of the very same class only, a frozen class hashed by its compared fields and an
unfrozen one with ``eq`` unhashable.

This module imports nothing of ttmesh: every layer may use it.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError, field
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["dataclass", "field"]

T = TypeVar("T", bound=type)


@overload
def dataclass(cls: T, /) -> T: ...


@overload
def dataclass(*, frozen: bool = False, eq: bool = True, repr: bool = True) -> Callable[[T], T]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def dataclass(
    cls: T | None = None, /, *, frozen: bool = False, eq: bool = True, repr: bool = True
) -> T | Callable[[T], T]:
    """``dataclasses.dataclass`` (``frozen``, ``eq``, ``repr``) without compiling its methods."""

    def wrap(cls: T) -> T:
        return _make(cls, frozen=frozen, eq=eq, repr=repr)

    return wrap if cls is None else wrap(cls)


def _make(cls: T, *, frozen: bool, eq: bool, repr: bool) -> T:
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base):
            raise TypeError(f"{cls.__qualname__}: a dataclass base: use dataclasses.dataclass")
    undocumented = not cls.__doc__
    if undocumented:  # (else the standard library writes one with inspect.signature)
        cls.__doc__ = cls.__qualname__
    # The standard library collects the fields and generates nothing (no __init__, __repr__
    # or __eq__ asked; not frozen: that is done below).
    dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    fields = dataclasses.fields(cls)
    for f in fields:
        if not f.init or f.kw_only is True or not f.compare or f.hash is not None or f.metadata:
            raise TypeError(
                f"{cls.__qualname__}.{f.name}: a field option ttmesh.dataclass does not take: "
                "use dataclasses.dataclass"
            )
    names = tuple(f.name for f in fields)
    if undocumented:
        cls.__doc__ = f"{cls.__name__}({', '.join(names)})"
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    params.init, params.repr, params.eq, params.frozen = True, repr, eq, frozen
    own = vars(cls)
    if "__init__" not in own:
        cls.__init__ = _init(cls, fields)  # type: ignore[misc]
    if repr and "__repr__" not in own:
        cls.__repr__ = _repr(cls, tuple(f.name for f in fields if f.repr))  # type: ignore[assignment]
    if eq and "__eq__" not in own:
        cls.__eq__ = _eq(names)  # type: ignore[assignment,method-assign]
    if "__hash__" not in own or own["__hash__"] is None:
        if eq and frozen:
            cls.__hash__ = _hash(names)  # type: ignore[assignment,method-assign]
        elif eq:
            cls.__hash__ = None  # type: ignore[assignment,method-assign]
    if frozen:
        cls.__setattr__, cls.__delattr__ = _frozen(cls, frozenset(names))  # type: ignore[method-assign]
    return cls


def _init(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    names = tuple(f.name for f in fields)
    count = len(names)
    position = {name: i for i, name in enumerate(names)}
    defaults = {f.name: f.default for f in fields if f.default is not MISSING}
    factories = {f.name: f.default_factory for f in fields if f.default_factory is not MISSING}
    post_init = getattr(cls, "__post_init__", None) is not None
    qualname = f"{cls.__qualname__}.__init__()"
    required = sum(1 for name in names if name not in defaults and name not in factories)
    takes = f"{count + 1}" if required == count else f"from {required + 1} to {count + 1}"
    takes += " positional argument" + ("" if takes == "1" else "s")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = len(args)
        if given > count:
            raise TypeError(f"{qualname} takes {takes} but {given + 1} were given")
        for name in kwargs:
            at = position.get(name)
            if at is None:
                raise TypeError(f"{qualname} got an unexpected keyword argument {name!r}")
            if at < given:
                raise TypeError(f"{qualname} got multiple values for argument {name!r}")
        values = self.__dict__  # set in field order, as the generated __init__ does
        for name, value in zip(names, args, strict=False):
            values[name] = value
        missing = []
        for name in names[given:]:
            if name in kwargs:
                values[name] = kwargs[name]
            elif name in defaults:
                values[name] = defaults[name]
            elif name in factories:
                values[name] = factories[name]()
            else:
                missing.append(name)
        if missing:
            raise TypeError(f"{qualname} missing {_missing(missing)}")
        if post_init:
            self.__post_init__()

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def _missing(names: list[str]) -> str:
    """As Python says it: ``2 required positional arguments: 'a' and 'b'``."""
    quoted = [repr(n) for n in names]
    listed = quoted[0] if len(quoted) == 1 else (
        f"{quoted[0]} and {quoted[1]}" if len(quoted) == 2
        else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"
    )  # fmt: skip
    plural = "s" if len(names) > 1 else ""
    return f"{len(names)} required positional argument{plural}: {listed}"


def _repr(cls: type, names: tuple[str, ...]) -> Callable[[Any], str]:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__qualname__}({shown})"

    __repr__.__qualname__ = f"{cls.__qualname__}.__repr__"
    return __repr__


def _fields_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The instance's values of ``names``, as a tuple (what the generated methods compare)."""
    if not names:
        return lambda _self: ()
    get = attrgetter(*names)
    return (lambda self: (get(self),)) if len(names) == 1 else get


def _eq(names: tuple[str, ...]) -> Callable[[Any, Any], Any]:
    values = _fields_of(names)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return values(self) == values(other)

    return __eq__


def _hash(names: tuple[str, ...]) -> Callable[[Any], int]:
    values = _fields_of(names)

    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _frozen(cls: Any, names: frozenset[str]) -> tuple[Callable[..., None], Callable[..., None]]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__
