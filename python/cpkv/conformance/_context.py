"""What one rank of an implementation under test receives: the Context (docs/conformance.md).

The Context is the harness's side of the contract. Everything batch-logical in it comes from the
C++ model through the bindings (layout, plan, page inverses, staging capacity, row content); the
memory it maps is shared with the peers (shared-memory files on CPU, CUDA IPC on GPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
import contextlib
import zlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from .. import _cpkv
from . import _adversity as adv
from . import _probes
from . import _shm
from . import _tokens


class StagingOverflow(RuntimeError):
    """Raise this from compose_layer to refuse a batch whose current pages exceed the declared staging
    (PROTOCOL.md section 4): every rank must raise it on the batch's first layer, before writing
    staging or waiting at a barrier."""


class ContractError(RuntimeError):
    """The implementation broke the contract (wrong output type, dtype or shape; a collective helper
    called with different arguments on different ranks). Its message is one located line."""


@dataclass
class SharedBuffer:
    """Memory every rank maps: ``local`` is this rank's, ``peers[r]`` rank r's (``peers[rank] is local``)."""

    name: str
    local: torch.Tensor
    peers: List[torch.Tensor]


class Events:
    """Optional hooks that feed cpkv's state checker (invariants 1, 2 and 4, sim/checkers.hpp).

    ``slots`` are current indices (the staging slot a page occupies in a half). The harness merges
    every rank's events by CLOCK_MONOTONIC after each batch and replays them into the simulator's
    checker, so call a hook just before the write or read it announces, and arrive/passed just
    before and just after the barrier.
    """

    def __init__(self, ctx: "Context") -> None:
        self._ctx = ctx
        self.log: List[Tuple[int, str, int, int, int, int, int]] = []
        self.used = False
        # Off in --time runs and while a layer is captured into a CUDA graph: the hooks then return at
        # once (no host copy of the slots, nothing logged).
        self.enabled = True

    def _add(self, what: str, a: int = 0, b: int = 0, c: int = 0) -> None:
        if not self.enabled:
            return
        self.used = True
        self.log.append((time.monotonic_ns(), what, self._ctx.rank, self._ctx.layer, a, b, c))

    def write(self, half: Optional[int] = None, slots: Sequence[int] = (), what: str = "fill", *, rows=None) -> None:
        """This rank writes (what='zero' or 'fill') the given current indices of its staging half; or,
        for an exchange without staging (section 12), `rows=`: the current rows of the tokens it
        computed (ctx.token_rows(...)["current_row"]), just before it writes them into its all-gather
        send buffer (invariant 1 per token row; invariant 2 against the collective that reads them)."""
        if not self.enabled:
            return
        if rows is not None:
            for row in _ints(rows):
                self._add("token_write", row)
            self._ctx._publish(adv.STAGE_FILLED)
            return
        if what not in ("zero", "fill"):
            raise ContractError(f"events.write: what={what!r} is not 'zero' or 'fill'")
        if half is None:
            raise ContractError("events.write: give a staging half and its slots, or rows= (the current rows of a token split)")
        for slot in _ints(slots):
            self._add("write", half, slot, 1 if what == "fill" else 0)
        if what == "fill":
            self._ctx._publish(adv.STAGE_FILLED)

    def read(self, peer: int, half: int, slots: Sequence[int]) -> None:
        """This rank reads the given current indices of `peer`'s staging half."""
        if not self.enabled:
            return
        self._ctx._publish(adv.STAGE_READING)
        for slot in _ints(slots):
            self._add("read", peer, half, slot)

    @contextlib.contextmanager
    def collective(self, name: str, rows=()) -> Iterator[None]:
        """`with ctx.events.collective("all_gather", rows): dist.all_gather(...)`: this rank enters a
        collective every rank takes part in (the synchronization of a section 12 exchange), sending the
        current rows `rows` it wrote; on leaving it has read every peer's rows. Every rank must enter
        the same collectives in the same order (invariant 7). The harness may hold a rank inside it
        (after its entry, before the call), as the swarm holds a slow producer."""
        if not self.enabled:
            yield
            return
        call = 1 + sum(1 for e in self.log if e[1] == "collective_enter")
        self._add("collective_enter", call, zlib.crc32(name.encode()))
        for row in _ints(rows):
            self._add("collective_row", call, row)
        self._ctx._publish(adv.STAGE_ARRIVED)
        self._ctx.pause_point("collective")
        yield
        self._add("collective_exit", call, zlib.crc32(name.encode()))
        self._ctx._publish(adv.STAGE_PASSED)

    def arrive(self, phase: int) -> None:
        """This rank arrives at a counting barrier (phase: its arrivals so far, this one included)."""
        if not self.enabled:
            return
        self._add("arrive", phase)
        self._ctx._publish(adv.STAGE_ARRIVED, arrivals=phase)

    def passed(self, phase: int) -> None:
        """This rank passed the barrier it arrived at with `phase`."""
        if not self.enabled:
            return
        self._add("passed", phase)
        self._ctx._publish(adv.STAGE_PASSED)


def _ints(values: Sequence[int]) -> List[int]:
    if isinstance(values, torch.Tensor):
        with _probes.uncounted():  # the hook's own copy is not the implementation's synchronization
            return [int(v) for v in values.reshape(-1).tolist()]
    if isinstance(values, (int, np.integer)):
        return [int(values)]
    return [int(v) for v in values]


class Context:
    """One rank's view of the run. See docs/conformance.md for each field."""

    StagingOverflow = StagingOverflow

    def __init__(self, *, rank: int, setting: _cpkv.Setting, layers: int, seed: int, device: torch.device,
                 group, harness_group, run: str, positions: torch.Tensor, adversity: adv.Adversity,
                 ipc_capable: bool, dense_rows_max: int, timeout_s: float) -> None:
        self.rank = rank
        self.cp = setting.cp
        self.setting = setting
        self.layers = layers
        self.seed = seed
        self.device = device
        self.group = group
        self.kinds = list(setting.kind_names)
        self.row_bytes = {k.name: k.row_bytes for k in setting.kinds}
        self.staging_slots = _cpkv.staging_capacity(setting).staging_slots
        self.declared_staging_slots: Optional[int] = None
        self.no_staging = False  # ctx.declare_staging(None): overflow (invariant 3) does not apply
        self.pool: Dict[str, List[torch.Tensor]] = {}
        self.events = Events(self)
        self.batch: Optional[_cpkv.Batch] = None
        self.batch_index = -1
        self.layout: Optional[_cpkv.BatchLayout] = None
        self.layer = -1
        self._hgroup = harness_group
        self._run = run
        self._positions = positions.numpy()  # a view of the shared table: an element write costs 0.2 us, a tensor's 3.7 us (2026-12-02)
        self._adversity = adversity
        self._ipc_capable = ipc_capable
        self._dense_rows_max = dense_rows_max
        self._dense_out: Dict[str, torch.Tensor] = {}
        self.timeout_s = timeout_s  # the bound for the implementation's own waits (its barrier's timeout)
        self._buffers: List[SharedBuffer] = []
        self._rows_cache: Dict[str, torch.Tensor] = {}
        # The batch's plan, writers, slots and page inverses on the device, made once per batch: an
        # implementation that asks for them in every layer makes no host copy (nor synchronization)
        # of the harness's for it, and a layer can be captured into a CUDA graph. Not to be modified.
        self._batch_cache: Dict[str, torch.Tensor] = {}
        self._pool_guard = None  # the harness's copy of this rank's pool slabs (_guards.PoolGuard)
        # ctx.check_current per (layer, kind) of this batch: None (right) or the located line.
        self._current_checks: Dict[Tuple[int, str], Optional[str]] = {}
        # Whose tokens this rank's queries are (PROTOCOL.md sections 11, 12): what the attention plan is checked against.
        self.query_split = "pages"

    # --- what the implementation may call -------------------------------------------------------

    def ipc_capable(self) -> bool:
        """This rank's own probe of peer mapping (the harness can make it fail on one rank). Agree
        over the group (a MIN) before choosing a path: PROTOCOL.md section 7."""
        return self._ipc_capable

    def declare_staging(self, staging_slots: Optional[int]) -> None:
        """Declare the staging capacity (slots per half per kind) the implementation registered in
        setup; batches beyond it must be refused with StagingOverflow. Default: cpkv's capacity.
        None: no staging at all (section 12: the collective is the synchronization), so no batch
        overflows and none may be refused."""
        self.no_staging = staging_slots is None
        self.declared_staging_slots = None if staging_slots is None else int(staging_slots)

    def alloc_shared(self, name: str, nbytes: int, device: Optional[str] = None) -> SharedBuffer:
        """Collective (every rank, same name and size): memory every peer maps, on the run's device
        (device='cpu': host shared memory, for flags a host thread polls). New bytes are the 0xa5
        poison, as fresh GPU memory is garbage."""
        self._agree(("alloc_shared", name, int(nbytes), device))
        if (device or self.device.type) == "cuda":
            return self._alloc_cuda(name, int(nbytes))
        return self._alloc_cpu(name, int(nbytes), poison=True)

    def split(self, name: str) -> None:
        """Say which tokens this rank computes, so that the attention plan compose_layer returns is
        checked against them: "pages" (default: cpkv's page-aligned split, section 2),
        "zigzag_tokens" or "continuous_tokens" (a token split, section 12). Call it in setup or
        before a batch's first layer."""
        if name not in _cpkv.QUERY_SPLITS:
            raise ContractError(f"ctx.split({name!r}): not one of {', '.join(_cpkv.QUERY_SPLITS)}")
        self.query_split = name

    def attention_plan(self) -> torch.Tensor:
        """cpkv's attention plan of this rank for its split (ctx.split: the page-aligned split's ragged
        index plan, or the token split's) in section 11's neutral form, chosen by the model
        (model::variant_index_plan, as the GPU plugin's): (n, 5) int64 [request, q_base, q_len, kv_len, k_base]."""
        def make() -> torch.Tensor:
            # The page split's plan is that of any page variant: staging_direct's, as ctx.plan() is.
            variant = _tokens.VARIANT_OF_SPLIT.get(self.query_split, "staging_direct")
            plan = _cpkv.variant_plan(self.layout, variant, self.rank)
            segments = _cpkv.variant_index_plan(self.layout, self.batch, plan).attention_segments()
            return torch.from_numpy(np.ascontiguousarray(_cpkv.attention_plan_array(segments)))

        return self._cached(f"attention_plan-{self.query_split}", make)

    # --- an exchange without staging: section 12's token split (ctx.split first) -------------------

    def _token_map(self) -> _tokens.TokenMap:
        if self.query_split not in _tokens.VARIANT_OF_SPLIT:
            raise ContractError(f"the token helpers need a token split: call ctx.split('zigzag_tokens') or "
                                f"ctx.split('continuous_tokens') first (the split is {self.query_split!r})")
        key = f"token_map-{self.query_split}"
        if key not in self._batch_cache:
            self._batch_cache[key] = _tokens.token_map(self.layout, self.batch, self.query_split)
        return self._batch_cache[key]

    def max_rank_tokens(self) -> int:
        """The most current tokens one rank computes in this batch under the token split: the rows
        every rank sends to the all-gather (the others pad)."""
        return self._token_map().max_rank_tokens

    def current_tokens_total(self) -> int:
        """The batch's current tokens (the rows of the token order)."""
        return int(sum(r.extend_len for r in self.batch.requests))

    def batch_tokens(self) -> List[Dict[str, torch.Tensor]]:
        """Per rank, in its send order (request by request, token by token): its tokens' `request`,
        `token` (position in the request's sequence, prefix first), `dense_row`, `order` (place in
        the batch's token order) and `current_row` (current index * P + row), int64 on ctx.device,
        made once per batch: from the model's token owner rule (model::token_owner), not re-derived
        here. ctx.rank's entry is what it computes."""
        tokens = self._token_map()
        out = []
        for k, mine in enumerate(tokens.per_rank):
            out.append({name: self._cached(f"batch_tokens-{self.query_split}-{k}-{name}", lambda a=mine[name]: torch.from_numpy(a.copy()))
                        for name in ("request", "token", "dense_row", "order", "current_row")})
        return out

    def token_order(self) -> Dict[str, torch.Tensor]:
        """The batch's current tokens in token order (request by request, token by token: what the
        re-ordering after the all-gather produces): `request`, `token`, `dense_row`, `current_row`,
        int64 on ctx.device, made once per batch."""
        tokens = self._token_map()
        return {name: self._cached(f"token_order-{self.query_split}-{name}", lambda a=getattr(tokens, name): torch.from_numpy(a.copy()))
                for name in ("request", "token", "dense_row", "current_row")}

    def token_rows(self, requests, tokens) -> Dict[str, torch.Tensor]:
        """Where any current tokens (request, position in its sequence) live: `order` (place in the
        batch's token order), `current_row` (current index * P + row: what events.write(rows=) and
        events.collective take) and `dense_row`, int64 on ctx.device. ContractError names a token that
        is not current."""
        with _probes.uncounted():
            req = torch.as_tensor(requests).reshape(-1).cpu().numpy()
            tok = torch.as_tensor(tokens).reshape(-1).cpu().numpy()
        try:
            found = _tokens.rows_of(self._token_map(), self.setting.page_size, req, tok)
        except ValueError as error:
            raise ContractError(f"ctx.token_rows: {error}") from None
        with _probes.uncounted():
            return {name: torch.from_numpy(value).to(self.device) for name, value in found.items()}

    def check_current(self, kind: str, rows) -> None:
        """The check before the dense assembly: `rows` are this layer's current rows of `kind` in the
        batch's token order ((current_tokens_total(), row_bytes) uint8, after the all-gather and the
        re-ordering). The harness compares them with the specification's rows now, and the byte check
        of the dense buffer then says whether the gather or the assembly was wrong. Off in --time runs."""
        if self.events.enabled:
            from . import _check  # _check imports this module
            self._current_checks[(self.layer, kind)] = _check.current_rows_line(self, kind, rows)

    def pause_point(self, name: str) -> None:
        """Where the harness may inject a delay: 'before_fill', 'after_fill', 'before_barrier',
        'after_barrier', 'gather' (inside the gather, before reading peers' staging), or any other
        name (jitter only). 'after_fill' and 'gather' also tell the holds where this rank is."""
        if name == "after_fill":
            self._publish(adv.STAGE_FILLED)
        elif name == "gather":
            self._publish(adv.STAGE_READING)
        self._adversity.pause(name)

    def plan(self) -> torch.Tensor:
        """cpkv's staging_direct compose plan: (slot_count, 2) int64 [table_index, source_page]."""
        return self._cached("plan", lambda: torch.from_numpy(np.ascontiguousarray(_cpkv.staging_direct_plan(self.layout))))

    def writers(self) -> torch.Tensor:
        """int64 (current_pages_total,): the writer rank of each current page (section 2)."""
        return self._cached("writers", lambda: torch.from_numpy(self.layout.writers.astype(np.int64)))

    def current_slots(self) -> torch.Tensor:
        """int64 (current_pages_total,): the dense slot of each current page (section 3)."""
        return self._cached("current_slots", lambda: torch.from_numpy(np.ascontiguousarray(self.layout.current_slots)))

    def page_inverse(self, target: str = "dense") -> Dict[str, torch.Tensor]:
        """This rank's page inverse (section 5): request, token and dest_row per current token it
        computes, rows of the dense buffer (target='dense') or of staging (target='staging')."""
        inv = None

        def field(name: str):
            nonlocal inv
            if inv is None:
                inv = _cpkv.page_inverse(self.layout, self.batch, self.rank, target)
            return torch.from_numpy(np.ascontiguousarray(getattr(inv, name)).astype(np.int64))

        return {name: self._cached(f"inverse-{target}-{name}", lambda name=name: field(name)) for name in ("request", "token", "dest_row")}

    def tokens(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(request, token) int64 tensors of the current tokens this rank computes, in page-inverse order."""
        inverse = self.page_inverse("dense")
        return inverse["request"], inverse["token"]

    def rows(self, kind: str) -> torch.Tensor:
        """This layer's current rows of `kind` for tokens(): (n, row_bytes) uint8, the model's KV write."""
        if kind not in self._rows_cache:
            requests, tokens = self._tokens_host()
            self._rows_cache[kind] = self.row_content(kind, requests, tokens)
        return self._rows_cache[kind]

    def row_content(self, kind: str, requests, tokens) -> torch.Tensor:
        """The current rows of any (request, token) pairs on this layer (an implementation with a
        split of its own computes its own tokens' rows)."""
        with _probes.uncounted():
            req = [int(v) for v in torch.as_tensor(requests).reshape(-1).tolist()]
            tok = [int(v) for v in torch.as_tensor(tokens).reshape(-1).tolist()]
        out = torch.empty((len(tok), self.row_bytes[kind]), dtype=torch.uint8)
        _cpkv.conformance.fill_current_rows(out.numpy(), self.setting, self.seed, self.layer, kind, req, tok)
        with _probes.uncounted():
            return out.to(self.device)

    def dense_out(self, kind: str) -> torch.Tensor:
        """A dense output buffer of `kind` for this batch, (dense_rows(), row_bytes) uint8 on the device,
        at the SAME address in every batch (as a caching allocator hands it out): an implementation
        may compose into it. Its contents are whatever the last batch left."""
        if kind not in self._dense_out:
            # One guard page past the largest batch's rows; past this batch's rows it is poison, checked unwritten (_guards).
            rows = self._dense_rows_max + self.setting.page_size
            self._dense_out[kind] = torch.zeros((rows, self.row_bytes[kind]), dtype=torch.uint8, device=self.device)
            self._dense_out[kind][self.dense_rows():] = _cpkv.conformance.POISON_BYTE
        return self._dense_out[kind][: self.dense_rows()]

    def kinds_on(self, layer: int) -> List[str]:
        """The buffer kinds that exist on a layer (indexer_k on 'F' layers only)."""
        return [k for k in self.kinds if self.setting.kind_active(k, layer)]

    def dense_rows(self) -> int:
        """Rows of every dense buffer of this batch: slot_count * P."""
        return self.layout.slot_count * self.setting.page_size

    # --- the harness's side -----------------------------------------------------------------------

    def _cached(self, key: str, make) -> torch.Tensor:
        if key not in self._batch_cache:
            host = make()
            self._batch_cache[key + "/host"] = host
            with _probes.uncounted():  # the harness's copy to the device, not the implementation's
                self._batch_cache[key] = host.to(self.device)
        return self._batch_cache[key]

    def _tokens_host(self) -> Tuple[torch.Tensor, torch.Tensor]:
        self.page_inverse("dense")
        return self._batch_cache["inverse-dense-request/host"], self._batch_cache["inverse-dense-token/host"]

    def _warm(self, layer: int) -> None:
        """Every helper's tensors of this batch and layer made before a capture (they copy from the host)."""
        self.plan(), self.writers(), self.current_slots(), self.page_inverse("staging"), self.attention_plan()
        for kind in self.kinds_on(layer):
            self.rows(kind)

    def _publish(self, stage: int, arrivals: Optional[int] = None) -> None:
        row = self._positions[self.rank]
        row[adv.COL_BATCH] = self.batch_index
        row[adv.COL_LAYER] = self.layer
        row[adv.COL_STAGE] = stage
        row[adv.COL_TIME_NS] = time.monotonic_ns()
        if arrivals is not None:
            row[adv.COL_ARRIVALS] = arrivals

    def _begin_batch(self, index: int, batch: _cpkv.Batch) -> None:
        self.batch_index = index
        self.batch = batch
        self.layout = _cpkv.layout_batch(self.setting, batch)
        self._batch_cache = {}
        self._current_checks = {}

    def _begin_layer(self, layer: int) -> None:
        self.layer = layer
        self._rows_cache = {}
        self.events._add("layer_begin")
        self._publish(adv.STAGE_COMPOSE)

    def _agree(self, what: tuple) -> None:
        everyone: List[object] = [None] * self.cp
        dist.all_gather_object(everyone, what, group=self._hgroup)
        for rank, theirs in enumerate(everyone):
            if theirs != what:
                raise ContractError(f"{what[0]}: rank {self.rank} called it with {what[1:]}, rank {rank} with {theirs[1:]}")

    def _alloc_cpu_pool(self, name: str, nbytes: int) -> SharedBuffer:
        # The pool stays sparse (a slab of untouched pages costs no memory), so it is not poisoned.
        return self._alloc_cpu(name, nbytes, poison=False)

    def _alloc_cpu(self, name: str, nbytes: int, poison: bool) -> SharedBuffer:
        path = _shm.path_of(self._run, name, self.rank)
        _shm.create_file(path, nbytes)
        local = _shm.map_file(path, nbytes)
        if poison:
            _cpkv.conformance.poison(local.numpy(), nbytes)
        dist.barrier(group=self._hgroup)  # every file exists
        peers = [local if r == self.rank else _shm.map_file(_shm.path_of(self._run, name, r), nbytes) for r in range(self.cp)]
        dist.barrier(group=self._hgroup)  # every rank mapped every file: the names can go
        _shm.unlink_quietly(path)
        buffer = SharedBuffer(name, local, peers)
        self._buffers.append(buffer)
        return buffer

    def _alloc_cuda(self, name: str, nbytes: int) -> SharedBuffer:
        from torch.multiprocessing.reductions import reduce_tensor

        local = torch.full((max(nbytes, 1),), _cpkv.conformance.POISON_BYTE, dtype=torch.uint8, device=self.device)[:nbytes]
        torch.cuda.synchronize(self.device)
        handles: List[object] = [None] * self.cp
        dist.all_gather_object(handles, reduce_tensor(local), group=self._hgroup)
        peers = []
        for r, (rebuild, args) in enumerate(handles):
            peers.append(local if r == self.rank else rebuild(*args))
        dist.barrier(group=self._hgroup)  # every peer holds its mapping before any rank may free
        buffer = SharedBuffer(name, local, peers)
        self._buffers.append(buffer)
        return buffer
