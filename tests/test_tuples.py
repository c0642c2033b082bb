"""gpufix.tuples.NamedTuple behaves as typing.NamedTuple's class syntax does."""

from __future__ import annotations

import typing

from gpufix.tuples import NamedTuple


class Point(NamedTuple):
    """A point."""

    x: int
    y: int = 0
    label: str | None = None

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)

    @property
    def origin(self) -> bool:
        return self.x == self.y == 0


class TypedPoint(typing.NamedTuple):
    x: int
    y: int = 0
    label: str | None = None


def test_fields_defaults_methods_and_docstring_as_typing_makes_them() -> None:
    p = Point(3, -4)
    assert p == (3, -4, None) and p.norm1() == 7 and not p.origin and Point(0).origin
    assert Point._fields == TypedPoint._fields == ("x", "y", "label")
    assert Point._field_defaults == TypedPoint._field_defaults == {"y": 0, "label": None}
    assert p._replace(label="a") == Point(3, -4, "a") and p._asdict() == {"x": 3, "y": -4, "label": None}
    assert Point.__doc__ == "A point." and Point.__name__ == "Point" and Point.__module__ == __name__
    assert repr(p) == repr(TypedPoint(3, -4)).replace("TypedPoint", "Point")
    assert Point.__annotations__ == {"x": "int", "y": "int", "label": "str | None"}  # PEP 563 strings
    assert isinstance(p, tuple) and hash(p) == hash((3, -4, None))
