"""ttmesh.dataclass.dataclass behaves as dataclasses.dataclass for what ttmesh uses, without
compiling code (in-process, milliseconds)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from ttmesh import dataclass as ours

DECORATORS = {"stdlib": dataclasses.dataclass, "ttmesh": ours.dataclass}


def _point(make: Any, **params: Any) -> type:
    @make(**params)
    class Point:
        """A point."""

        x: int
        y: int = 0
        tags: list[str] = dataclasses.field(default_factory=list)
        note: str = dataclasses.field(default="", repr=False)

    return Point


def _pickled(cls: type) -> type:
    """A class pickle can find (as if defined at module level)."""
    cls.__qualname__ = cls.__name__
    globals()[cls.__name__] = cls
    return cls


@pytest.mark.parametrize("frozen", [False, True])
def test_the_same_behaviour_as_the_standard_library(frozen: bool) -> None:
    seen: dict[str, list[Any]] = {}
    for name, make in DECORATORS.items():
        cls = _point(make, frozen=frozen)
        out: list[Any] = []
        p = cls(1, 2, ["a"])
        out += [repr(p), repr(cls(x=3)), p == cls(1, 2, ["a"]), p == cls(1, 3), p != cls(1)]
        out += [p.__eq__(object()), cls(1).tags is not cls(1).tags]  # a factory per instance
        out += [
            dataclasses.asdict(p),
            dataclasses.astuple(p),
            [f.name for f in dataclasses.fields(p)],
        ]
        out += [repr(dataclasses.replace(p, y=5)), dataclasses.is_dataclass(cls)]
        out += [cls.__match_args__, list(vars(cls(1, note="n")))]  # set in field order
        out += [cls.__dataclass_params__.frozen, cls.__dataclass_params__.eq]  # type: ignore[attr-defined]
        for bad in ((), (1, 2, [], "n", 5)):  # missing x; one too many
            with pytest.raises(TypeError) as exc:
                cls(*bad)
            out.append(str(exc.value).split("__init__()", 1)[1])
        for kwargs in ({"x": 1, "z": 2}, {"y": 1}):
            with pytest.raises(TypeError) as exc:
                cls(**kwargs)
            out.append(str(exc.value).split("__init__()", 1)[1])
        with pytest.raises(TypeError) as exc:
            cls(1, x=2)
        out.append(str(exc.value).split("__init__()", 1)[1])
        if frozen:
            out.append(hash(cls(1, 2, ("t",))) == hash(cls(1, 2, ("t",))))  # type: ignore[arg-type]
            for what, name_ in (("set", "x"), ("del", "y"), ("set", "other")):
                with pytest.raises(dataclasses.FrozenInstanceError) as frozen_exc:
                    if what == "set":
                        setattr(p, name_, 9)
                    else:
                        delattr(p, name_)
                out.append(str(frozen_exc.value))
        else:
            out.append(cls.__hash__ is None)  # eq without frozen: unhashable
            p.x = 7
            out.append(p.x)
        out.append(repr(copy.deepcopy(p)))
        seen[name] = out
    assert seen["ttmesh"] == seen["stdlib"]


def test_eq_false_keeps_identity_and_post_init_runs() -> None:
    for make in DECORATORS.values():

        @make(frozen=True, eq=False)
        class Job:
            """A job."""

            name: str
            size: int = 1

            def __post_init__(self) -> None:
                object.__setattr__(self, "size", self.size * 2)

        a, b = Job("j"), Job("j")
        assert a != b and hash(a) != hash(b) and a.size == 2
        assert {a: 1}[a] == 1


def test_pickles_and_nests() -> None:
    @_pickled
    @ours.dataclass(frozen=True)
    class Leaf:
        """A leaf."""

        value: float

    @_pickled
    @ours.dataclass
    class Tree:
        """A tree."""

        leaves: list[Leaf] = dataclasses.field(default_factory=list)

    tree = Tree([Leaf(1.0), Leaf(float("nan"))])
    again = pickle.loads(pickle.dumps(tree))
    assert repr(again) == "Tree(leaves=[Leaf(value=1.0), Leaf(value=nan)])"
    nan = Leaf(float("nan"))
    assert nan == nan and (nan,) == (nan,)  # identical values compare equal, as tuples do
    loop = Tree()
    loop.leaves.append(loop)  # type: ignore[arg-type]
    assert repr(loop) == "Tree(leaves=[...])"


def test_what_it_does_not_take_is_refused() -> None:
    for field in (dataclasses.field(default=0, compare=False), dataclasses.field(default=0, init=False),
                  dataclasses.field(default=0, metadata={"a": 1}), dataclasses.field(default=0, kw_only=True)):  # fmt: skip

        class Odd:
            """odd"""

            a: int = field  # type: ignore[assignment]

        with pytest.raises(TypeError, match=r"use dataclasses\.dataclass"):
            ours.dataclass(Odd)

    @dataclasses.dataclass
    class Base:
        a: int

    class Child(Base):
        """child"""

        b: int = 0

    with pytest.raises(TypeError, match="a dataclass base"):
        ours.dataclass(Child)


def test_no_code_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []
    real = compile

    def counting(source: Any, *args: Any, **kwargs: Any) -> Any:
        compiled.append(str(source)[:40])
        return real(source, *args, **kwargs)

    monkeypatch.setattr("builtins.exec", lambda *a, **k: compiled.append("exec"))
    monkeypatch.setattr("builtins.compile", counting)
    _point(ours.dataclass, frozen=True)
    _point(ours.dataclass)
    assert compiled == []


def test_the_same_errors_for_every_count_of_arguments() -> None:
    said: dict[str, list[str]] = {}
    for name, make in DECORATORS.items():

        @make
        class Empty:
            """Nothing."""

        @make
        class Three:
            """Three, all needed."""

            a: int
            b: int
            c: int

        out = []
        for call in (lambda: Empty(1), lambda: Three(), lambda: Three(1), lambda: Three(1, 2),
                     lambda: Three(1, 2, 3, 4), lambda: Three(1, b=2, d=4)):  # fmt: skip
            with pytest.raises(TypeError) as exc:
                call()
            out.append(str(exc.value).split("__init__()", 1)[1])
        out.append(repr(Empty()) + repr(Three(1, 2, c=3)))
        said[name] = out
    assert said["ttmesh"] == said["stdlib"]
