"""`typing.NamedTuple`'s class syntax without importing `typing` (about 2 ms of start-up, a fifth
of what `gpufix explain` may spend beyond Python's own start): the class body's annotations name
the fields in order, values assigned to them are defaults, and methods, properties and the
docstring land on the `collections.namedtuple` made from them, as typing does it. Type checkers
see `typing.NamedTuple` itself (modules import it under TYPE_CHECKING)."""

from __future__ import annotations

from collections import namedtuple

_CLASS_KEYS = ("__module__", "__qualname__", "__annotations__", "__orig_bases__", "__classcell__")


class _NamedTupleMeta(type):
    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, object]) -> type:
        if not bases:  # the NamedTuple base itself
            return super().__new__(mcls, name, bases, namespace)
        fields = list(namespace.get("__annotations__", {}))  # type: ignore[call-overload]
        defaults = [namespace[f] for f in fields if f in namespace]
        cls = namedtuple(name, fields, defaults=defaults or None, module=namespace.get("__module__"))  # type: ignore[misc]
        cls.__annotations__ = dict(namespace.get("__annotations__", {}))  # type: ignore[call-overload]
        for key, value in namespace.items():
            if key in fields or key in _CLASS_KEYS:
                continue
            setattr(cls, key, value)
        return cls


class NamedTuple(metaclass=_NamedTupleMeta):
    """Base for `class Point(NamedTuple): x: int; y: int = 0`."""
