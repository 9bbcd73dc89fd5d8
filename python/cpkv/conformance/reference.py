"""Reference implementations of the exchange, written from PROTOCOL.md in plain torch ops (CPU and
CUDA), each with planted bugs a constructor argument switches on (``mutant=NAME``).

They are what an engine's own code looks like to the harness: classes with setup / compose_layer /
end_batch / teardown over a Context, and nothing of cpkv's model beyond what the Context hands every
implementation. The harness must catch every planted bug (python/tests/test_conformance.py).

- ``StagingDirect``: section 5. Zero and fill this rank's pages of staging half l % 2, a counting
  barrier over host flag memory, then ONE slot-dense gather per kind over the pointer table of 2*cp
  entries (pool bases, then staging bases).
Both return their attention plan beside the dense buffers (``"attention"``: the model's plan of the
page-aligned split, ``ctx.attention_plan()``, section 11), where the plan bugs of invariant 9 live.

- ``V2``: section 7. The prefix pages by one gather from the pool (current slots zero), the current
  pages through a compact buffer of every current page, writer-exclusive, summed over the group.
  The sum is a one-shot all-reduce over IPC (each rank reads every peer's compact buffer after a
  barrier and adds), as an engine's custom all-reduce kernel does it; its compact buffers rotate
  over two parity halves, as staging does, so the barrier and parity bugs apply to it too.
  ``V2(allreduce="collective")`` sums with torch.distributed.all_reduce instead.

- ``AllGatherZigzag``, ``AllGatherContinuous``: section 12, an exchange without staging. Each rank's
  token rows (ctx.batch_tokens(), the model's token split) padded to ctx.max_rank_tokens(), ONE
  torch.distributed.all_gather per kind, the re-ordering into token order (checked before the
  assembly: ctx.check_current), then the dense assembly with the prefix from the pool. Their own
  planted bugs are ALLGATHER_MUTANTS (no staging, no barrier: the staging bugs do not apply).
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from ._context import Context

# The planted bugs (PROTOCOL.md section 9), one line each: what the code does wrong.
MUTANTS = {
    "single_half": "every layer uses parity half 0",
    "no_barrier": "no barrier between the fill and the gather",
    "skip_zero": "the rank's staging (or compact) pages are not zeroed before the fill",
    "token_split": "current tokens split at token granularity (zigzag over tokens): a page can get two writers",
    "arrive_before_fill": "the rank arrives at the barrier before its fill and waits after it",
    "skip_idle_barrier": "a rank with no current page to write skips the barrier",
    "address_keyed_plan_cache": "the compose plan is cached on the dense buffer's address, not on the batch",
    "rank_local_overflow": "the overflow verdict from this rank's own pages times cp, not from the batch",
    # Invariant 9: the attention plan compose_layer returns beside the dense buffers (its bytes stay right).
    "batch_as_one_sequence": "the attention plan takes the batch's requests as one causal sequence: kv_len counts the earlier requests' keys",
    "causal_off_by_one": "the attention plan's kv_len is one short: a query does not see itself",
    "key_base_skips_prefix": "the attention plan's k_base is the request's first current row: its prefix keys are skipped",
    # Last: its mismatched collectives time out, and a gloo group that timed out is broken for the
    # cases a session runs after it on the same ranks (the next case's setup raises).
    "unagreed_capability": "the IPC capability is not agreed over the group (no MIN)",
}
# The bugs that live in the attention plan only.
PLAN_MUTANTS = ("batch_as_one_sequence", "causal_off_by_one", "key_base_skips_prefix")
# Bugs that need more than one layer: the harness runs at least two layers for them.
MULTI_LAYER = ("single_half",)
# How long a barrier waiter sleeps between polls of the peers' counters.
POLL_S = 0.0001


class CountingBarrier:
    """Section 5 step 3: one monotonic counter per rank in host shared memory; barrier k passes when
    every counter >= k. Reusable without reset, phase-safe, and bounded: a waiter that times out
    names itself, the phase and the rank it waited for."""

    def __init__(self, ctx: Context) -> None:
        self.counters = ctx.alloc_shared("barrier", 8, device="cpu")
        self.mine = self.counters.local.view(torch.int64)
        self.mine[0] = 0
        self.peers = [c.view(torch.int64) for c in self.counters.peers]
        self.phase = 0

    def arrive(self, ctx: Context) -> None:
        if ctx.device.type == "cuda":
            torch.cuda.current_stream(ctx.device).synchronize()  # the fill is done before any peer may read it
        ctx.pause_point("before_barrier")
        self.phase += 1
        ctx.events.arrive(self.phase)
        self.mine[0] = self.phase

    def wait(self, ctx: Context) -> None:
        deadline = time.monotonic() + ctx.timeout_s
        for peer, counter in enumerate(self.peers):
            while int(counter[0]) < self.phase:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"barrier: rank {ctx.rank} waited {ctx.timeout_s:.0f} s at phase {self.phase} "
                                       f"(batch {ctx.batch_index} layer {ctx.layer}) for rank {peer}, at phase {int(counter[0])}")
                time.sleep(POLL_S)
        ctx.events.passed(self.phase)
        ctx.pause_point("after_barrier")


def token_split_tokens(ctx: Context) -> Dict[str, torch.Tensor]:
    """The planted token_split: zigzag over each request's extend TOKENS (2*cp blocks), as public zigzag
    code splits, instead of over its pages. Returns the tokens this rank then computes."""
    requests, tokens = [], []
    blocks = 2 * ctx.cp
    for r, req in enumerate(ctx.batch.requests):
        n = req.extend_len
        bounds = [0]
        for j in range(blocks):
            bounds.append(bounds[-1] + n // blocks + (1 if j < n % blocks else 0))
        for j in (ctx.rank, blocks - 1 - ctx.rank):
            for t in range(bounds[j], bounds[j + 1]):
                requests.append(r)
                tokens.append(req.prefix_len + t)
    return {"request": torch.tensor(requests, dtype=torch.int64), "token": torch.tensor(tokens, dtype=torch.int64)}


class _Exchange:
    """What both references share: mutant switch, the plan cache, overflow, the fill's sources."""

    def __init__(self, mutant: Optional[str] = None, events: bool = True) -> None:
        if mutant is not None and mutant not in MUTANTS:
            raise TypeError(f"unknown mutant '{mutant}' (known: {', '.join(MUTANTS)})")
        self.mutant = mutant
        self.use_events = events
        self._plan = None
        self._plan_key = None

    def bug(self, name: str) -> bool:
        return self.mutant == name

    def half(self, layer: int) -> int:
        return 0 if self.bug("single_half") else layer % 2

    def agree_capability(self, ctx: Context) -> bool:
        mine = torch.tensor([1 if ctx.ipc_capable() else 0], dtype=torch.int32)
        if not self.bug("unagreed_capability"):
            if ctx.device.type == "cuda":
                mine = mine.to(ctx.device)
            dist.all_reduce(mine, op=dist.ReduceOp.MIN, group=ctx.group)
        return bool(int(mine.item()))

    def refuse_overflow(self, ctx: Context) -> None:
        layout = ctx.layout
        total = layout.current_pages_total
        if self.bug("rank_local_overflow"):
            total = int((ctx.writers() == ctx.rank).sum()) * ctx.cp
        if total > self.staging_slots:
            raise ctx.StagingOverflow(f"batch {ctx.batch_index}: {total} current pages > {self.staging_slots} staging slots")

    def plan(self, ctx: Context, kind: str):
        # Anchored on the batch object (section 5), never on a buffer address.
        key = ctx.dense_out(kind).data_ptr() if self.bug("address_keyed_plan_cache") else id(ctx.batch)
        if self._plan is None or key != self._plan_key:
            self._plan_key = key
            self._plan = self.build_plan(ctx)
        return self._plan

    def fill_sources(self, ctx: Context, kind: str, target: str):
        """(rows, destination rows, current indices written): this rank's rows and where they go."""
        layout, page = ctx.layout, ctx.setting.page_size
        if self.bug("token_split"):
            mine = token_split_tokens(ctx)
            req, tok = mine["request"], mine["token"]
            first_index = torch.tensor(layout.request_first_current_index, dtype=torch.int64)
            first_slot = torch.tensor(layout.request_first_current_slot, dtype=torch.int64)
            prefix = torch.tensor([r.prefix_len for r in ctx.batch.requests], dtype=torch.int64)
            offset = tok - prefix[req]
            index = first_index[req] + offset // page
            base = index if target == "staging" else first_slot[req] + offset // page
            dest = base * page + offset % page
            rows = ctx.row_content(kind, req, tok)
        else:
            inverse = ctx.page_inverse(target)
            dest = inverse["dest_row"]
            rows = ctx.rows(kind)
            index = None
        own = self.own_pages(ctx) if index is None else torch.unique(index)
        return rows, dest.to(ctx.device), own

    def own_pages(self, ctx: Context) -> torch.Tensor:
        return torch.nonzero(ctx.writers() == ctx.rank).reshape(-1)

    # --- the shape both exchanges share, with the planted-bug switches in one place ---------------

    # The shared buffer of 2 parity halves a rank fills (staging, or v2's compact buffer).
    halves_name = "staging"

    def setup(self, ctx: Context) -> None:
        self.staging_slots = ctx.staging_slots
        ctx.declare_staging(self.staging_slots)
        self.ipc = self.agree_capability(ctx)
        page = ctx.setting.page_size
        self.halves: Dict[str, List[torch.Tensor]] = {}
        for kind in ctx.kinds:
            shared = ctx.alloc_shared(f"{self.halves_name}-{kind}", 2 * self.staging_slots * page * ctx.row_bytes[kind])
            self.halves[kind] = [p.view(2, self.staging_slots, page, ctx.row_bytes[kind]) for p in shared.peers]
        self.barrier = CountingBarrier(ctx)

    def compose_layer(self, ctx: Context, layer: int) -> Dict[str, torch.Tensor]:
        if layer == 0:
            self.refuse_overflow(ctx)
        out = fallback_compose(ctx, layer) if not self.ipc else self.compose(ctx, layer, self.half(layer), ctx.kinds_on(layer))
        out["attention"] = self.attention(ctx)
        return out

    def attention(self, ctx: Context) -> torch.Tensor:
        """This rank's attention plan (section 11): the model's, with the planted plan bugs."""
        plan = ctx.attention_plan()
        if self.mutant not in PLAN_MUTANTS:
            return plan
        plan = plan.clone()
        requests = plan[:, 0]
        prefix = torch.tensor([r.prefix_len for r in ctx.batch.requests], dtype=torch.int64, device=plan.device)
        if self.bug("batch_as_one_sequence"):
            keys = torch.tensor([r.prefix_len + r.extend_len for r in ctx.batch.requests], dtype=torch.int64, device=plan.device)
            plan[:, 3] += (torch.cumsum(keys, 0) - keys)[requests]  # every earlier request's keys, as one sequence would count them
        elif self.bug("causal_off_by_one"):
            plan[:, 3] -= 1
        elif self.bug("key_base_skips_prefix"):
            plan[:, 4] += prefix[requests]
        return plan

    def zero_slots(self, ctx: Context, own: torch.Tensor) -> torch.Tensor:
        """The slots of this rank's half zeroed before its fill."""
        return own

    def fill(self, ctx: Context, layer: int, half: int, kinds: List[str]) -> torch.Tensor:
        """Zero and fill this rank's pages of half `half` of every kind; returns the pages it wrote."""
        own = self.own_pages(ctx)
        if self.bug("arrive_before_fill"):
            self.barrier.arrive(ctx)  # the planted bug: peers may pass before this rank's fill
        for kind in kinds:
            rows, dest, own = self.fill_sources(ctx, kind, "staging")
            mine = self.halves[kind][ctx.rank][half]
            if not self.bug("skip_zero"):
                zeroed = self.zero_slots(ctx, own)
                if self.use_events:
                    ctx.events.write(half, zeroed, "zero")
                mine[zeroed.to(ctx.device)] = 0
            ctx.pause_point("before_fill")
            if self.use_events:
                ctx.events.write(half, own, "fill")
            mine.view(-1, ctx.row_bytes[kind])[dest] = rows
        ctx.pause_point("after_fill")
        return own

    def sync(self, ctx: Context, own: torch.Tensor) -> None:
        """The barrier between the fill and the reads of peers' halves (section 5 step 3)."""
        skips = self.bug("no_barrier") or (self.bug("skip_idle_barrier") and own.numel() == 0)
        if not skips and not self.bug("arrive_before_fill"):
            self.barrier.arrive(ctx)
        if not skips:
            self.barrier.wait(ctx)

    def end_batch(self, ctx: Context) -> None:
        pass

    def teardown(self, ctx: Context) -> None:
        pass


class StagingDirect(_Exchange):
    """PROTOCOL.md section 5, in torch ops."""

    def build_plan(self, ctx: Context) -> torch.Tensor:
        return ctx.plan()  # (slots, 2): [table_index, source_page], the same on every layer

    def compose(self, ctx: Context, layer: int, half: int, kinds: List[str]) -> Dict[str, torch.Tensor]:
        self.sync(ctx, self.fill(ctx, layer, half, kinds))
        return {kind: self.gather(ctx, layer, half, kind) for kind in kinds}

    def gather(self, ctx: Context, layer: int, half: int, kind: str) -> torch.Tensor:
        """ONE slot-dense gather over the 2*cp-entry pointer table: one index per table entry."""
        plan = self.plan(ctx, kind)
        dense = ctx.dense_out(kind).view(-1, ctx.setting.page_size, ctx.row_bytes[kind])
        table = plan[:, 0]
        for entry in range(2 * ctx.cp):
            if entry == ctx.cp:
                ctx.pause_point("gather")  # pool pages read; the staging pages next
            slots = torch.nonzero(table == entry).reshape(-1)
            if slots.numel() == 0:
                continue
            pages = plan[slots, 1]
            if entry < ctx.cp:
                dense[slots] = ctx.pool[kind][entry][layer][pages]
            else:
                if self.use_events:
                    ctx.events.read(entry - ctx.cp, half, pages)
                dense[slots] = self.halves[kind][entry - ctx.cp][half][pages]
        return dense.view(-1, ctx.row_bytes[kind])


def fallback_compose(ctx: Context, layer: int) -> Dict[str, torch.Tensor]:
    """v2_fallback (section 7): no peer mapping. Local materialize of owned prefix pages and own
    current rows into a zeroed dense buffer, then one whole-buffer sum all-reduce (uint8 view)."""
    out = {}
    page = ctx.setting.page_size
    plan = ctx.plan()
    inverse = ctx.page_inverse("dense")
    for kind in ctx.kinds_on(layer):
        dense = torch.zeros((plan.shape[0], page, ctx.row_bytes[kind]), dtype=torch.uint8, device=ctx.device)
        mine = torch.nonzero((plan[:, 0] == ctx.rank)).reshape(-1)
        dense[mine] = ctx.pool[kind][ctx.rank][layer][plan[mine, 1]]
        dense.view(-1, ctx.row_bytes[kind])[inverse["dest_row"]] = ctx.rows(kind)
        dist.all_reduce(dense.view(-1), op=dist.ReduceOp.SUM, group=ctx.group)
        out[kind] = dense.view(-1, ctx.row_bytes[kind])
    return out


class V2(_Exchange):
    """PROTOCOL.md section 7, v2: prefix gather from the pool, compact all-reduce of current pages."""

    def __init__(self, mutant: Optional[str] = None, events: bool = True, allreduce: str = "ipc") -> None:
        super().__init__(mutant, events)
        self.halves_name = "compact"  # the compact buffer holds every current page
        if allreduce not in ("ipc", "collective"):
            raise TypeError(f"allreduce='{allreduce}' is not 'ipc' or 'collective'")
        self.allreduce = allreduce

    def build_plan(self, ctx: Context) -> torch.Tensor:
        plan = ctx.plan().clone()
        plan[plan[:, 0] >= ctx.cp, 0] = -1  # the -1 sentinel: current slots are zero-filled by the gather
        return plan

    def zero_slots(self, ctx: Context, own: torch.Tensor) -> torch.Tensor:
        # Writer-exclusive bytes: every page this rank does not write is zero in its compact buffer.
        return torch.arange(ctx.layout.current_pages_total)

    def compose(self, ctx: Context, layer: int, half: int, kinds: List[str]) -> Dict[str, torch.Tensor]:
        own = self.fill(ctx, layer, half, kinds)
        total = ctx.layout.current_pages_total
        if self.allreduce == "collective":
            summed = {k: self.collective_sum(ctx, k, half, total) for k in kinds}
        else:
            self.sync(ctx, own)
            summed = {k: self.ipc_sum(ctx, k, half, total) for k in kinds}
        return {k: self.unpack(ctx, layer, k, summed[k]) for k in kinds}

    def ipc_sum(self, ctx: Context, kind: str, half: int, total: int) -> torch.Tensor:
        """One-shot all-reduce: every rank reads every peer's compact half and adds (uint8, exact: one
        non-zero contributor per byte)."""
        ctx.pause_point("gather")
        acc = torch.zeros_like(self.halves[kind][ctx.rank][half][:total])
        writers = ctx.writers()
        for peer in range(ctx.cp):
            if self.use_events and peer != ctx.rank:
                # The pages the peer filled; the rest of its compact half is its zeros.
                ctx.events.read(peer, half, torch.nonzero(writers == peer).reshape(-1))
            acc += self.halves[kind][peer][half][:total]
        return acc

    def collective_sum(self, ctx: Context, kind: str, half: int, total: int) -> torch.Tensor:
        summed = self.halves[kind][ctx.rank][half][:total].clone()
        dist.all_reduce(summed.view(-1), op=dist.ReduceOp.SUM, group=ctx.group)
        return summed

    def unpack(self, ctx: Context, layer: int, kind: str, summed: torch.Tensor) -> torch.Tensor:
        plan = self.plan(ctx, kind)
        page, row_bytes = ctx.setting.page_size, ctx.row_bytes[kind]
        dense = torch.zeros((plan.shape[0], page, row_bytes), dtype=torch.uint8, device=ctx.device)
        for entry in range(ctx.cp):
            slots = torch.nonzero(plan[:, 0] == entry).reshape(-1)
            if slots.numel():
                dense[slots] = ctx.pool[kind][entry][layer][plan[slots, 1]]
        dense[ctx.current_slots()] = summed
        return dense.view(-1, row_bytes)


# --- section 12: the token-split exchanges, without staging ---------------------------------------

# Their planted bugs (mutant=NAME), one line each: what the code does wrong.
ALLGATHER_MUTANTS = {
    "skipped_reorder": "the gathered rows are taken rank by rank, not re-ordered into token order",
    "padding_left_in": "the padded all-gather is read as if unpadded: a padding row takes a later rank's token's place",
    "wrong_rank_count": "the re-ordering takes every rank's token count as this rank's own: a rank with more loses rows",
}


class _AllGather:
    """PROTOCOL.md section 12: this rank's token rows padded to the largest rank's count, ONE
    all-gather per kind, the re-ordering into token order, then the dense assembly (prefix from pool)."""

    split = "zigzag_tokens"

    def __init__(self, mutant: Optional[str] = None) -> None:
        if mutant is not None and mutant not in ALLGATHER_MUTANTS:
            raise TypeError(f"unknown mutant '{mutant}' (known: {', '.join(ALLGATHER_MUTANTS)})")
        self.mutant = mutant

    def setup(self, ctx: Context) -> None:
        ctx.declare_staging(None)  # no staging: the all-gather is the synchronization
        ctx.split(self.split)

    def compose_layer(self, ctx: Context, layer: int) -> Dict[str, torch.Tensor]:
        tokens, count = ctx.batch_tokens(), ctx.max_rank_tokens()
        mine, out = tokens[ctx.rank], {"attention": ctx.attention_plan()}
        for kind in ctx.kinds_on(layer):
            send = torch.zeros((count, ctx.row_bytes[kind]), dtype=torch.uint8, device=ctx.device)
            ctx.events.write(rows=mine["current_row"])
            send[:mine["token"].numel()] = ctx.row_content(kind, mine["request"], mine["token"])  # this rank's KV write
            gathered = torch.empty((ctx.cp * count, ctx.row_bytes[kind]), dtype=torch.uint8, device=ctx.device)
            with ctx.events.collective("all_gather", mine["current_row"]):
                dist.all_gather(list(gathered.chunk(ctx.cp)), send, group=ctx.group)
            ordered = self.reorder(ctx, tokens, gathered, count)
            ctx.check_current(kind, ordered)  # the rows before the assembly: a finding says which step was wrong
            out[kind] = self.assemble(ctx, layer, kind, ordered)
        return out

    def reorder(self, ctx: Context, tokens, gathered: torch.Tensor, count: int) -> torch.Tensor:
        ordered = torch.zeros((ctx.current_tokens_total(), gathered.shape[1]), dtype=torch.uint8, device=ctx.device)
        counts = [theirs["order"].numel() for theirs in tokens]
        for k, theirs in enumerate(tokens):
            n = min(counts[k], counts[ctx.rank]) if self.mutant == "wrong_rank_count" else counts[k]
            packed = sum(counts[:k])  # rows of the earlier ranks without their padding
            start = packed if self.mutant == "padding_left_in" else k * count
            where = torch.arange(packed, packed + n, device=ctx.device) if self.mutant == "skipped_reorder" else theirs["order"][:n]
            ordered[where] = gathered[start:start + n]
        return ordered

    def assemble(self, ctx: Context, layer: int, kind: str, ordered: torch.Tensor) -> torch.Tensor:
        plan, page, row_bytes = ctx.plan(), ctx.setting.page_size, ctx.row_bytes[kind]
        dense = torch.zeros((plan.shape[0], page, row_bytes), dtype=torch.uint8, device=ctx.device)
        for owner in range(ctx.cp):  # prefix pages from their storage owners' pool slabs
            slots = torch.nonzero(plan[:, 0] == owner).reshape(-1)
            dense[slots] = ctx.pool[kind][owner][layer][plan[slots, 1]]
        dense.view(-1, row_bytes)[ctx.token_order()["dense_row"]] = ordered  # partial pages keep zero tails
        return dense.view(-1, row_bytes)

    def end_batch(self, ctx: Context) -> None:
        pass

    def teardown(self, ctx: Context) -> None:
        pass


class AllGatherZigzag(_AllGather):
    """Section 12, zigzag: rank k computes token blocks k and 2*cp-1-k of every request."""


class AllGatherContinuous(_AllGather):
    """Section 12, continuous: token t of a request is computed by rank t % cp."""

    split = "continuous_tokens"
