"""Implementations with reuse hazards whose bytes come out right when the timing is lucky (loaded by
path, as a user's file is), and ones whose planted bug is chosen by a constructor argument or by an
environment variable (reproducers must keep both)."""

import os

from cpkv.conformance.reference import StagingDirect


class ZeroesTheOtherHalf(StagingDirect):
    """Zeroes its pages of the OTHER parity half (the previous layer's, which peers may still be
    gathering) instead of this layer's, then fills this layer's half. On a batch of whole current
    pages the fill covers every byte of its pages, so its own bytes are always right; a peer still
    gathering the previous layer reads zeros only when it is slow (PROTOCOL.md section 6: zeroing is
    a write)."""

    def fill(self, ctx, layer, half, kinds):
        other = 1 - half
        own = self.own_pages(ctx)
        for kind in kinds:
            rows, dest, own = self.fill_sources(ctx, kind, "staging")
            ctx.events.write(other, own, "zero")
            self.halves[kind][ctx.rank][other][own.to(ctx.device)] = 0
            ctx.pause_point("before_fill")
            ctx.events.write(half, own, "fill")
            self.halves[kind][ctx.rank][half].view(-1, ctx.row_bytes[kind])[dest] = rows
        ctx.pause_point("after_fill")
        return own


class Configurable(StagingDirect):
    """A foreign implementation whose planted bug is its own constructor argument `bug` (one of the
    reference's names), with a `note` argument that changes nothing (kept in the replay all the same)."""

    def __init__(self, bug=None, note=""):
        super().__init__(mutant=bug)
        self.note = note


class BugFromEnvironment(StagingDirect):
    """A foreign implementation whose planted bug rides in an environment variable."""

    def __init__(self):
        super().__init__(mutant=os.environ.get("CPKV_TEST_FOREIGN_BUG") or None)
