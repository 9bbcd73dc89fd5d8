"""Hypothesis strategies that draw what the C++ property generators draw.

They mirror ``properties/src/properties.cpp`` (``gen_setting``, ``gen_batch``, ``gen_case``) with
the same ranges and the same choices, so an engine's test suite explores the space the C++
properties explore::

    from hypothesis import given
    import cpkv.strategies as cs

    @given(cs.batches())
    def test_my_plan_builder(drawn):
        setting, batch = drawn
        layout = cpkv.layout_batch(setting, batch)
        ...

Every object drawn is built by the C++ model's own constructors and passes ``cpkv.validate``.
Bounds default to the C++ ``properties::Bounds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Union

from hypothesis import strategies as st

from . import _cpkv

# properties::Bounds (properties/include/cpkv/properties/properties.hpp).
CP_MAX = 8
PAGE_SIZE_LOG2_MAX = 8  # P up to 256
REQUESTS_MAX = 64
LAYERS_MAX = 8
TOKENS_MAX = 4096  # extend + prefix tokens over the whole batch
BATCHES_MAX = 3
POOL_PAGES_MAX = 128

# gen_setting's buffer-kind sets.
KIND_SETS = (("kv_fp8", "indexer_k"), ("kv_fp8",), ("kv_bf16", "indexer_k"), ("kv_bf16",), ("indexer_k",))
CAPS_SHAPES = ("tight", "loose", "absent", "mib_override")


class SettingAndBatch(NamedTuple):
    """What ``batches()`` draws when no setting is given: a setting and one batch valid for it."""

    setting: _cpkv.Setting
    batch: _cpkv.Batch


@dataclass
class Case:
    """A whole property case, as gen_case draws it: a setting with caps, 1..3 batches, a variant, the
    layers to simulate, a schedule (choices), an IPC-missing rank (-1: none) and a content seed."""

    setting: _cpkv.Setting
    batches: List[_cpkv.Batch]
    variant: str
    layers: int
    schedule: List[int] = field(default_factory=list)
    ipc_missing_rank: int = -1
    seed: int = 1


def _with_caps(s: _cpkv.Setting, max_total_extend_tokens: Optional[int] = None, max_batch_requests: Optional[int] = None,
               staging_mib: Optional[int] = None) -> _cpkv.Setting:
    return _cpkv.Setting(cp=s.cp, page_size=s.page_size, kinds=s.kind_names, layer_pattern=s.layer_pattern, pool_pages=s.pool_pages,
                         split=s.split, max_total_extend_tokens=max_total_extend_tokens, max_batch_requests=max_batch_requests,
                         staging_mib=staging_mib)


Fixed = Union[None, int, str, List[str], st.SearchStrategy]


def _pick(draw: st.DrawFn, value, drawn: st.SearchStrategy):
    # None: gen_setting's own draw; a strategy: drawn from it; anything else: that value, exactly.
    if value is None:
        return draw(drawn)
    if isinstance(value, st.SearchStrategy):
        return draw(value)
    return value


def _check_fixed(cp, page_size, kinds, layer_pattern, split, pool_pages) -> None:
    """A fixed value the model refuses is refused here, once, with the model's own located line
    (cpkv.InputError: 'page_size: 3 is not a power of two'), not as a draw that fails every example."""
    probe = {"cp": 1, "page_size": 1, "kinds": list(KIND_SETS[0]), "layer_pattern": "F", "pool_pages": 1, "split": _cpkv.SPLIT_POLICIES[0]}
    fixed = {"cp": cp, "page_size": page_size, "kinds": kinds, "layer_pattern": layer_pattern, "split": split, "pool_pages": pool_pages}
    for name, value in fixed.items():
        if value is not None and not isinstance(value, st.SearchStrategy):
            probe[name] = list(value) if name == "kinds" else value
    _cpkv.Setting(**probe)


def settings(cp_max: int = CP_MAX, page_size_log2_max: int = PAGE_SIZE_LOG2_MAX, layers_max: int = LAYERS_MAX, *,
             cp: Fixed = None, page_size: Fixed = None, kinds: Fixed = None, layer_pattern: Fixed = None, split: Fixed = None,
             pool_pages: Fixed = None) -> st.SearchStrategy:
    """A setting without caps, as gen_setting draws it: cp in 1..cp_max, P = 2^(0..page_size_log2_max),
    one of five buffer-kind sets, 1..layers_max layers each 'F' or 'S', a split policy, and 1..128
    pool pages.

    Each keyword fixes one field exactly: ``settings(cp=2, page_size=4)`` draws only settings of cp 2
    and P 4 (the value is used as given, not reached by filtering the draws, so any value the model
    accepts costs nothing, ``cp=7, page_size=128`` included); a strategy instead of a value is drawn
    from. A value the model refuses raises cpkv.InputError here, naming the field."""
    _check_fixed(cp, page_size, kinds, layer_pattern, split, pool_pages)
    return _settings(cp_max, page_size_log2_max, layers_max, cp, page_size, kinds, layer_pattern, split, pool_pages)


@st.composite
def _settings(draw: st.DrawFn, cp_max: int, page_size_log2_max: int, layers_max: int, cp: Fixed, page_size: Fixed, kinds: Fixed,
              layer_pattern: Fixed, split: Fixed, pool_pages: Fixed) -> _cpkv.Setting:
    cp = _pick(draw, cp, st.integers(1, cp_max))
    page_size = _pick(draw, page_size, st.integers(0, page_size_log2_max).map(lambda log2: 1 << log2))
    kinds = list(_pick(draw, kinds, st.sampled_from(KIND_SETS)))
    patterns = st.integers(1, layers_max).flatmap(lambda n: st.lists(st.sampled_from("FS"), min_size=n, max_size=n).map("".join))
    pattern = _pick(draw, layer_pattern, patterns)
    split = _pick(draw, split, st.sampled_from(_cpkv.SPLIT_POLICIES))
    pool_pages = _pick(draw, pool_pages, st.integers(1, POOL_PAGES_MAX))
    return _cpkv.Setting(cp=cp, page_size=page_size, kinds=kinds, layer_pattern=pattern, pool_pages=pool_pages, split=split)


def _distinct(ids: List[int], pool_pages: int) -> List[int]:
    # make_page_tables_distinct: a request names each pool page at most once (the trace reader and
    # cpkv.validate refuse a repeat); a repeated id moves to the next id not yet used, mod the pool.
    used = set()
    for k, page in enumerate(ids):
        while page in used:
            page = (page + 1) % pool_pages
        used.add(page)
        ids[k] = page
    return ids


def _draw_batch(draw: st.DrawFn, setting: _cpkv.Setting, requests_max: int, tokens_max: int) -> _cpkv.Batch:
    # gen_batch: extends are one token, page-exact or a partial last page (1..4 pages); prefixes are
    # 0..4 whole pages with scattered ids (shared across requests, distinct within one); requests stop at the token budget.
    P = setting.page_size
    count = draw(st.integers(1, requests_max))
    requests = []
    tokens = 0
    for r in range(count):
        shape = draw(st.integers(0, 2))
        pages = draw(st.integers(1, 4))
        if shape == 0:
            extend_len = 1
        elif shape == 1:
            extend_len = pages * P
        else:
            extend_len = (pages - 1) * P + draw(st.integers(1, P))
        prefix_pages = draw(st.integers(0, 4))
        prefix_len = prefix_pages * P
        if r > 0 and tokens + extend_len + prefix_len > tokens_max:
            break
        prefix_pages = min(prefix_pages, setting.pool_pages)
        prefix_len = prefix_pages * P
        ids = _distinct([draw(st.integers(0, setting.pool_pages - 1)) for _ in range(prefix_pages)], setting.pool_pages)
        tokens += extend_len + prefix_len
        requests.append(_cpkv.Request(prefix_len=prefix_len, extend_len=extend_len, prefix_pages=ids))
    return _cpkv.Batch(requests)


@st.composite
def batches(draw: st.DrawFn, setting: Union[None, _cpkv.Setting, st.SearchStrategy] = None, requests_max: int = REQUESTS_MAX,
            tokens_max: int = TOKENS_MAX) -> Union[_cpkv.Batch, SettingAndBatch]:
    """A batch as gen_batch draws it.

    With ``setting`` (a Setting or a strategy of them) it draws a Batch valid for that setting; with
    no setting it draws one from ``settings()`` too and yields ``SettingAndBatch(setting, batch)``.
    """
    if setting is None:
        drawn = draw(settings())
        return SettingAndBatch(drawn, _draw_batch(draw, drawn, requests_max, tokens_max))
    if isinstance(setting, st.SearchStrategy):
        setting = draw(setting)
    return _draw_batch(draw, setting, requests_max, tokens_max)


def _caps_for(draw: st.DrawFn, setting: _cpkv.Setting, drawn: List[_cpkv.Batch], shape: str) -> _cpkv.Setting:
    P = setting.page_size
    extend_max = max([1] + [sum(r.extend_len for r in b.requests) for b in drawn])
    requests_max = max([1] + [len(b) for b in drawn])
    if shape == "tight":
        # Around the edge: the largest batch needs about ceil(extend / P) + requests slots.
        return _with_caps(setting, max(1, extend_max + draw(st.integers(-2 * P, P))), draw(st.integers(1, requests_max)))
    if shape == "loose":
        return _with_caps(setting, extend_max * 4, requests_max * 4)
    if shape == "mib_override":
        return _with_caps(setting, staging_mib=draw(st.integers(1, 3)))
    return setting


@st.composite
def cases(draw: st.DrawFn, tight_caps: bool = False, ipc_faults: bool = False, cp_max: int = CP_MAX,
          page_size_log2_max: int = PAGE_SIZE_LOG2_MAX, layers_max: int = LAYERS_MAX, requests_max: int = REQUESTS_MAX,
          tokens_max: int = TOKENS_MAX, batches_max: int = BATCHES_MAX) -> Case:
    """A whole case as gen_case draws it: a setting, 1..batches_max batches, caps (tight around the
    overflow edge, loose, absent, or a 1..3 MiB override; always tight with ``tight_caps``), a variant,
    a schedule of choices in 0..7, an IPC-missing rank (only with ``ipc_faults``) and a seed in 1..999."""
    setting = draw(settings(cp_max, page_size_log2_max, layers_max))
    count = draw(st.integers(1, batches_max))
    drawn = [_draw_batch(draw, setting, requests_max, tokens_max) for _ in range(count)]
    shape = "tight" if tight_caps else draw(st.sampled_from(CAPS_SHAPES))
    setting = _caps_for(draw, setting, drawn, shape)
    variant = draw(st.sampled_from(_cpkv.VARIANTS))
    schedule = draw(st.lists(st.integers(0, 7)))
    ipc_missing_rank = draw(st.integers(-1, setting.cp - 1)) if ipc_faults else -1
    seed = draw(st.integers(1, 999))
    return Case(setting, drawn, variant, setting.layer_count, schedule, ipc_missing_rank, seed)
