"""Update filters: what each peer puts on the wire every round (see `wire` for the format).

`make_filter(name, **kwargs)` builds one by name:
    none    NoFilter     the dense update, unchanged
    value   ValueFilter  value-bounded: small changes deferred with residuals (error feedback)
"""
from __future__ import annotations

from p2plearn.filter.base import UpdateFilter
from p2plearn.filter.none import NoFilter
from p2plearn.filter.value import ValueFilter
from p2plearn.filter.wire import ABSENT, DENSE, SPARSE, EncodedUpdate, decode

FILTERS: dict[str, type[UpdateFilter]] = {cls.name: cls for cls in (NoFilter, ValueFilter)}


def make_filter(name: str, **kwargs) -> UpdateFilter:
    """The filter called `name` (none, value), built with `kwargs`."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}; choose one of {', '.join(FILTERS)}")
    return FILTERS[name](**kwargs)


__all__ = ["ABSENT", "DENSE", "FILTERS", "SPARSE", "EncodedUpdate", "NoFilter", "UpdateFilter", "ValueFilter",
           "decode", "make_filter"]
