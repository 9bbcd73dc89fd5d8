"""Section 12 exchanges that break the contract in ways the references do not, for the harness's own
tests (loaded by path, as a user's file is)."""

import torch
import torch.distributed as dist

from cpkv.conformance.reference import AllGatherZigzag


class AssemblyOffByOne(AllGatherZigzag):
    """Gathers and re-orders right (its current rows pass ctx.check_current), then assembles each
    current row one dense row too far: the dense assembly is wrong, not the gather."""

    def assemble(self, ctx, layer, kind, ordered):
        dense = super().assemble(ctx, layer, kind, torch.zeros_like(ordered))
        dense[ctx.token_order()["dense_row"] + 1] = ordered
        return dense


class WriteInsideCollective(AllGatherZigzag):
    """Announces its token rows' write only after it entered the all-gather (as code that fills its
    send buffer on another stream without waiting would): the bytes happen to be right, but nothing
    orders the write before the peers' reads (invariant 2, happens-before)."""

    def compose_layer(self, ctx, layer):
        tokens, count = ctx.batch_tokens(), ctx.max_rank_tokens()
        mine, out = tokens[ctx.rank], {"attention": ctx.attention_plan()}
        for kind in ctx.kinds_on(layer):
            send = torch.zeros((count, ctx.row_bytes[kind]), dtype=torch.uint8)
            send[:mine["token"].numel()] = ctx.row_content(kind, mine["request"], mine["token"])
            gathered = torch.empty((ctx.cp * count, ctx.row_bytes[kind]), dtype=torch.uint8)
            with ctx.events.collective("all_gather", mine["current_row"]):
                ctx.events.write(rows=mine["current_row"])
                dist.all_gather(list(gathered.chunk(ctx.cp)), send, group=ctx.group)
            out[kind] = self.assemble(ctx, layer, kind, self.reorder(ctx, tokens, gathered, count))
        return out


class EveryRowTwice(AllGatherZigzag):
    """Every rank announces every token row of the batch as its own write (a split that gives each
    token to every rank): the bytes are right, invariant 1 per token row is not."""

    def compose_layer(self, ctx, layer):
        ctx.events.write(rows=ctx.token_order()["current_row"])
        return super().compose_layer(ctx, layer)


class RefusesWithoutStaging(AllGatherZigzag):
    """Declares no staging, then refuses batch 0 as if it overflowed."""

    def compose_layer(self, ctx, layer):
        if ctx.batch_index == 0:
            raise ctx.StagingOverflow("no room")
        return super().compose_layer(ctx, layer)
