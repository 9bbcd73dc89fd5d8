"""Differential checking of an engine's dense buffers against the model, rank by rank."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Tuple, Union

from . import _cpkv
from ._errors import DenseMismatchError, InputError

Buffers = Union[Mapping[int, Any], Iterable[Any]]


def _by_rank(dense_by_rank: Buffers) -> Iterable[Tuple[int, Any]]:
    if isinstance(dense_by_rank, Mapping):
        return sorted(dense_by_rank.items())
    return enumerate(dense_by_rank)


def _kind_name(setting: _cpkv.Setting, kind: Union[int, str]) -> str:
    return kind if isinstance(kind, str) else setting.kind_names[kind]


def first_mismatch(dense_by_rank: Buffers, setting: _cpkv.Setting, layout: _cpkv.BatchLayout, seed: int, layer: int,
                   kind: Union[int, str]) -> Optional[Tuple[int, _cpkv.Mismatch]]:
    """The first rank whose dense buffer differs from the model, with the located Mismatch; None if all equal.

    dense_by_rank: a sequence (index = rank) or a {rank: buffer} mapping of one-byte-item arrays
    (NumPy, or a GPU tensor's bytes copied to the host), each slot_count * P rows of row_bytes. The
    expected buffer is computed once by the C++ model; the comparison is the model's too.
    """
    expected = _cpkv.expected_dense(setting, layout, seed, layer, kind)
    row_bytes = expected.shape[1]
    for rank, actual in _by_rank(dense_by_rank):
        if not 0 <= rank < layout.cp:
            raise InputError("rank", f"{rank} is not a rank of the cp = {layout.cp} group")
        mismatch = _cpkv.compare_dense(actual, expected, layout.page_size, row_bytes)
        if mismatch is not None:
            return rank, mismatch
    return None


def assert_dense_equal(dense_by_rank: Buffers, setting: _cpkv.Setting, layout: _cpkv.BatchLayout, seed: int, layer: int,
                       kind: Union[int, str], batch: Optional[int] = None) -> None:
    """Raise DenseMismatchError naming the first wrong rank, slot, row and byte (and the count of wrong bytes).

    The message is the line the simulator and the GPU backend print for the same defect.
    """
    found = first_mismatch(dense_by_rank, setting, layout, seed, layer, kind)
    if found is not None:
        rank, mismatch = found
        raise DenseMismatchError(rank, mismatch, mismatch.describe(rank, layer, _kind_name(setting, kind), batch))
