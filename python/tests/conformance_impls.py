"""Misbehaving implementations for the harness's own tests (loaded by path, as a user's file is)."""

import time

import torch

from cpkv.conformance.reference import StagingDirect


class RaisesOnLayer1(StagingDirect):
    """A correct exchange that raises on layer 1 of batch 0 on rank 1."""

    def compose_layer(self, ctx, layer):
        if ctx.rank == 1 and ctx.batch_index == 0 and layer == 1:
            raise ValueError("engine bug: page table lookup failed")
        return super().compose_layer(ctx, layer)


class WrongDtype(StagingDirect):
    """Returns its dense buffers viewed as int32."""

    def compose_layer(self, ctx, layer):
        return {k: v.view(torch.int32) for k, v in super().compose_layer(ctx, layer).items()}


class NeverReturns(StagingDirect):
    """Rank 0 never returns from its first layer (a wait of its own with no bound)."""

    def compose_layer(self, ctx, layer):
        while ctx.rank == 0:
            time.sleep(0.05)
        return super().compose_layer(ctx, layer)


class NumpyOutputs(StagingDirect):
    """A correct exchange that hands back its dense buffers as NumPy arrays (the array interface)."""

    def compose_layer(self, ctx, layer):
        return {k: v.cpu().numpy() for k, v in super().compose_layer(ctx, layer).items()}


class WritesPastDense(StagingDirect):
    """Correct bytes, but on layer 1 it writes one page more than the batch's dense rows (a kernel
    sized by the wrong slot count), into the memory past the buffer it was handed."""

    def compose_layer(self, ctx, layer):
        out = super().compose_layer(ctx, layer)
        if layer == 1:
            for dense in (out[kind] for kind in ctx.kinds_on(layer)):  # the dense buffers, not the "attention" plan beside them
                past = torch.as_strided(dense, (dense.shape[0] + ctx.setting.page_size, dense.shape[1]), (dense.shape[1], 1))
                past[dense.shape[0]:] = 0x11
        return out


class WritesIntoPeerPool(StagingDirect):
    """Correct bytes, but rank 1 writes into rank 0's pool slab through its mapping, on the last
    local page (one no batch of tiny.jsonl reads, so no dense byte shows it)."""

    def compose_layer(self, ctx, layer):
        out = super().compose_layer(ctx, layer)
        if ctx.rank == 1 and ctx.batch_index == 0 and layer == 0:
            ctx.pool["kv_fp8"][0][1][-1] = 0x22
        return out


class _OnlyDlpack:
    """A foreign array that speaks DLPack and nothing else (no __array_interface__, not a tensor)."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __dlpack__(self, stream=None):
        return self._tensor.__dlpack__()

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


class _OnlyCudaArrayInterface:
    """A foreign CUDA array that exposes only __cuda_array_interface__ (as CuPy or Numba arrays do)."""

    def __init__(self, tensor):
        self._tensor = tensor
        self.__cuda_array_interface__ = tensor.__cuda_array_interface__


class DlpackOutputs(StagingDirect):
    """A correct exchange that hands back its dense buffers as DLPack-only objects."""

    def compose_layer(self, ctx, layer):
        return {k: _OnlyDlpack(v) for k, v in super().compose_layer(ctx, layer).items()}


class CudaArrayInterfaceOutputs(StagingDirect):
    """A correct exchange that hands back its CUDA dense buffers through __cuda_array_interface__ only."""

    def compose_layer(self, ctx, layer):
        return {k: _OnlyCudaArrayInterface(v) for k, v in super().compose_layer(ctx, layer).items()}


class AllGatherZigzag:
    """Section 12's token-split exchange, as upstream CP prefill writes it: each rank computes the rows
    of its zigzag token blocks of every request (2*cp blocks per request, rank k takes k and 2cp-1-k),
    the current rows of every rank are rebuilt with ONE torch.distributed.all_gather per kind (each
    rank's rows padded to the largest rank's count) and re-ordered into cpkv's dense layout; prefix
    rows come from the pool. Its bytes are right at any cp.

    plan="one_sequence" returns the attention plan such code gets when it builds its causal lengths
    for the batch as one sequence (kv_len counts every earlier request's keys, k_base 0): right for
    the first request, wrong for every later one. plan="per_request" returns the right one, built with
    cpkv.attention.from_zigzag_halves from the per-half lengths."""

    def __init__(self, plan: str = "per_request") -> None:
        if plan not in ("per_request", "one_sequence"):
            raise TypeError(f"plan={plan!r} is not 'per_request' or 'one_sequence'")
        self.plan_kind = plan
        self._batch = None

    def setup(self, ctx):
        # No staging and no overflow (section 12: the collective is the synchronization). The contract
        # cannot say "no staging" yet (issue 37), so declare a staging no batch exceeds.
        ctx.declare_staging(1 << 40)
        ctx.split("zigzag_tokens")

    @staticmethod
    def halves(n: int, cp: int, rank: int):
        """(begin, end) of rank's two zigzag token blocks of a request of n tokens."""
        bounds = [0]
        for j in range(2 * cp):
            bounds.append(bounds[-1] + n // (2 * cp) + (1 if j < n % (2 * cp) else 0))
        return [(bounds[j], bounds[j + 1]) for j in (rank, 2 * cp - 1 - rank)]

    def _per_batch(self, ctx):
        """Per rank: its (request, extend offset) tokens, and their dense rows; made once per batch."""
        if self._batch is ctx.batch:
            return self._tokens
        page = ctx.setting.page_size
        first_slot = list(ctx.layout.request_first_current_slot)
        self._tokens = []
        for rank in range(ctx.cp):
            requests, offsets = [], []
            for r, req in enumerate(ctx.batch.requests):
                for begin, end in self.halves(req.extend_len, ctx.cp, rank):
                    requests += [r] * (end - begin)
                    offsets += list(range(begin, end))
            dest = [first_slot[r] * page + t for r, t in zip(requests, offsets)]
            self._tokens.append((requests, offsets, torch.tensor(dest, dtype=torch.int64, device=ctx.device)))
        self._batch = ctx.batch
        return self._tokens

    def compose_layer(self, ctx, layer):
        import torch.distributed as dist

        tokens = self._per_batch(ctx)
        count_max = max(1, max(len(t[0]) for t in tokens))
        plan, page = ctx.plan(), ctx.setting.page_size
        out = {}
        for kind in ctx.kinds_on(layer):
            row_bytes = ctx.row_bytes[kind]
            requests, offsets, _ = tokens[ctx.rank]
            prefix = [ctx.batch.requests[r].prefix_len for r in requests]
            padded = torch.zeros((count_max, row_bytes), dtype=torch.uint8, device=ctx.device)
            if requests:
                padded[:len(requests)] = ctx.row_content(kind, requests, [p + t for p, t in zip(prefix, offsets)])
            gathered = [torch.empty_like(padded) for _ in range(ctx.cp)]
            dist.all_gather(gathered, padded, group=ctx.group)
            dense = torch.zeros((plan.shape[0], page, row_bytes), dtype=torch.uint8, device=ctx.device)
            for owner in range(ctx.cp):  # prefix pages from their storage owners' pool slabs
                slots = torch.nonzero(plan[:, 0] == owner).reshape(-1)
                if slots.numel():
                    dense[slots] = ctx.pool[kind][owner][layer][plan[slots, 1]]
            flat = dense.view(-1, row_bytes)
            for rank, (rank_requests, _, dest) in enumerate(tokens):  # the re-ordering
                flat[dest] = gathered[rank][:len(rank_requests)]
            out[kind] = flat
        out["attention"] = self.attention(ctx)
        return out

    def attention(self, ctx):
        import cpkv.attention as attention

        requests = list(range(len(ctx.batch.requests)))
        prefix = [r.prefix_len for r in ctx.batch.requests]
        halves = [self.halves(r.extend_len, ctx.cp, ctx.rank) for r in ctx.batch.requests]
        q_prev = [e - b for (b, e), _ in halves]
        q_next = [e - b for _, (b, e) in halves]
        if self.plan_kind == "one_sequence":
            # The batch as one causal sequence: offsets and key counts run on across requests.
            before = [sum(p + r.extend_len for p, r in zip(prefix[:i], ctx.batch.requests[:i])) for i in requests]
            k_base = [0] * len(requests)
        else:
            before = [0] * len(requests)
            k_base = attention.key_bases(ctx.setting, ctx.batch)
        kv_prev = [before[i] + prefix[i] + halves[i][0][1] for i in requests]
        kv_next = [before[i] + prefix[i] + halves[i][1][1] for i in requests]
        plan = attention.from_zigzag_halves(q_prev, q_next, kv_prev, kv_next, request=requests,
                                            q_base_prev=[h[0][0] for h in halves], q_base_next=[h[1][0] for h in halves], k_base=k_base)
        return torch.from_numpy(plan).to(ctx.device)

    def end_batch(self, ctx):
        pass

    def teardown(self, ctx):
        pass


class AllGatherOneSequencePlan(AllGatherZigzag):
    """The same exchange with the plan that takes the batch as one causal sequence."""

    def __init__(self) -> None:
        super().__init__(plan="one_sequence")


class AllGatherContinuous(AllGatherZigzag):
    """The continuous token split (token t of a request to rank t % cp) with its right plan, built
    from the neutral form directly (one segment per token: consecutive tokens are on other ranks)."""

    def setup(self, ctx):
        ctx.declare_staging(1 << 40)
        ctx.split("continuous_tokens")

    def _per_batch(self, ctx):
        if self._batch is ctx.batch:
            return self._tokens
        page = ctx.setting.page_size
        first_slot = list(ctx.layout.request_first_current_slot)
        self._tokens = []
        for rank in range(ctx.cp):
            pairs = [(r, t) for r, req in enumerate(ctx.batch.requests) for t in range(rank, req.extend_len, ctx.cp)]
            dest = [first_slot[r] * page + t for r, t in pairs]
            self._tokens.append(([r for r, _ in pairs], [t for _, t in pairs], torch.tensor(dest, dtype=torch.int64, device=ctx.device)))
        self._batch = ctx.batch
        return self._tokens

    def attention(self, ctx):
        import cpkv
        import cpkv.attention

        base = cpkv.attention.key_bases(ctx.setting, ctx.batch)
        requests, offsets, _ = self._per_batch(ctx)[ctx.rank]
        segments = [cpkv.RaggedSegment(r, t, 1, ctx.batch.requests[r].prefix_len + t + 1, int(base[r])) for r, t in zip(requests, offsets)]
        return segments


class AttentionInt32(StagingDirect):
    """Right bytes and plan, but the plan as an int32 tensor (the contract says int64)."""

    def compose_layer(self, ctx, layer):
        out = super().compose_layer(ctx, layer)
        out["attention"] = out["attention"].to(torch.int32)
        return out


class AttentionNotAPlan(StagingDirect):
    """Right bytes, but "attention" is a dict of per-request lengths (not a plan in any form)."""

    def compose_layer(self, ctx, layer):
        out = super().compose_layer(ctx, layer)
        out["attention"] = {"kv_len": [12, 4]}
        return out


class NoAttention(StagingDirect):
    """Right bytes and no "attention" plan at all (what every implementation before issue 33 returns)."""

    def compose_layer(self, ctx, layer):
        out = super().compose_layer(ctx, layer)
        del out["attention"]
        return out


class AllGatherUndeclaredSplit(AllGatherZigzag):
    """The right zigzag token plan, but the implementation never says its queries follow a token split
    (ctx.split): the checker holds it to cpkv's page-aligned split."""

    def setup(self, ctx):
        ctx.declare_staging(1 << 40)


class AttentionOfRankZero(StagingDirect):
    """Right bytes, but every rank returns rank 0's plan (as a list of cpkv.RaggedSegment): rank 0's
    tokens are queries on every rank, rank 1's on none."""

    def compose_layer(self, ctx, layer):
        import cpkv

        out = super().compose_layer(ctx, layer)
        out["attention"] = cpkv.ragged_index_plan(ctx.layout, ctx.batch, 0).attention_segments()
        return out
