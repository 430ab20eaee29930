"""A finite set of categories and their indices (the wire representation of a categorical report).

Categories are deduplicated in first-seen order (OpenDP takes a set; we keep an order so that an
index means the same category on the device and on the server). ``index_of`` maps values to
indices, ``-1`` for values outside the set, vectorized for integer and string arrays.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.errors import DomainError, ParameterError


def is_hashable(v: object) -> bool:
    """Whether ``v`` can be a dictionary key (and therefore a category)."""
    try:
        hash(v)
    except TypeError:
        return False
    return True


def withheld_value_message(value: object, problem: str) -> str:
    """An error message about an input value that does not quote it (it may be a user's private value)."""
    return f"a value of type {type(value).__name__} {problem} (the value is not shown: it may be private)"


def index_dtype(k: int) -> np.dtype[Any]:
    """The narrowest unsigned dtype holding indices ``0 .. k - 1`` (int64 beyond 32 bits)."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if k - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.int64)


class CategorySet:
    """``k >= 2`` distinct hashable categories; ``categories[i]`` has index ``i``."""

    def __init__(self, categories: Iterable[Hashable] | CategorySet, *, name: str = "categories") -> None:
        if isinstance(categories, CategorySet):
            categories = categories.categories
        if isinstance(categories, (str, bytes)) or not isinstance(categories, Iterable):
            raise ParameterError(name, categories, "must be a collection of at least two distinct categories")
        items = list(categories)
        if not all(is_hashable(c) for c in items):
            raise ParameterError(name, categories, "must hold hashable values")
        distinct = tuple(dict.fromkeys(items))
        if len(distinct) < 2:
            raise ParameterError(name, categories, "must hold at least two distinct categories")
        self.categories: tuple[Hashable, ...] = distinct
        self._index = {c: i for i, c in enumerate(distinct)}
        self._array = _typed_array(distinct)
        self._sorted: tuple[NDArray[Any], NDArray[np.int64]] | None = None

    def __len__(self) -> int:
        return len(self.categories)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.categories)

    def __contains__(self, value: object) -> bool:
        return is_hashable(value) and value in self._index

    def __repr__(self) -> str:
        return f"CategorySet({list(self.categories)!r})"

    @property
    def type_name(self) -> str:
        """The categories' Python type name (``Any`` when mixed), for domain descriptors."""
        names = {type(c).__name__ for c in self.categories}
        return names.pop() if len(names) == 1 else "Any"

    def index(self, value: object) -> int:
        """Index of one value, ``-1`` when it is not a category."""
        return self._index.get(value, -1) if is_hashable(value) else -1

    def index_of(self, values: Any) -> NDArray[np.int64]:
        """Index of each value (same shape), ``-1`` for values that are not categories."""
        arr = np.asarray(values)
        cats = self._array
        if arr.dtype.kind in "iu" and arr.dtype != np.int64:
            if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
                cats = None  # beyond int64: compare exactly through the dictionary
            else:
                arr = arr.astype(np.int64)  # same dtype as the categories: exact comparisons
        if cats is not None and arr.dtype.kind in "iU" and (arr.dtype.kind == "U") == (cats.dtype.kind == "U"):
            if self._sorted is None:
                order = np.argsort(cats, kind="stable").astype(np.int64)
                self._sorted = (cats[order], order)
            ordered, order = self._sorted
            pos = np.searchsorted(ordered, arr).clip(0, len(ordered) - 1)
            return np.where(ordered[pos] == arr, order[pos], -1).astype(np.int64)
        flat = [self.index(v) for v in arr.ravel().tolist()]
        return np.asarray(flat, dtype=np.int64).reshape(arr.shape)

    def member_indices(self, values: Any) -> NDArray[np.int64]:
        """Like :meth:`index_of`, but a value outside the set raises :class:`DomainError`."""
        idx = self.index_of(values)
        if idx.size and int(idx.min()) < 0:
            bad = np.asarray(values).ravel()[int(np.argmin(idx.ravel()))]
            raise DomainError(withheld_value_message(bad, f"is not one of the {len(self)} categories"))
        return idx

    def values_of(self, indices: NDArray[np.integer]) -> NDArray[Any]:
        """The categories at ``indices`` (a typed array for int or str categories, else objects)."""
        cats = self._array
        if cats is None:
            cats = np.empty(len(self.categories), dtype=object)
            cats[:] = list(self.categories)
        return cats[np.asarray(indices)]

    def check_indices(self, indices: Any) -> NDArray[np.integer]:
        """``indices`` as an integer array with every element in ``[0, k)``; else :class:`DomainError`."""
        x = np.asarray(indices)
        if x.dtype.kind not in "iu":
            raise DomainError(f"category indices must be integers, got dtype {x.dtype}")
        k = len(self.categories)
        if x.size and (int(x.min()) < 0 or int(x.max()) >= k):
            outside = int(np.count_nonzero((x < 0) | (x >= k)))  # never quote them: indices are users' values
            raise DomainError(f"category indices must be in [0, {k}), got {outside} outside it")
        return x


def _typed_array(cats: tuple[Hashable, ...]) -> NDArray[Any] | None:
    """The categories as a typed numpy array when they are all ints (not bools) or all strings."""
    if all(isinstance(c, str) for c in cats):
        return np.array(cats)
    if all(isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) for c in cats):
        try:
            return np.array(cats, dtype=np.int64)
        except OverflowError:
            return None
    return None
