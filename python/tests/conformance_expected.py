"""Which checks the harness may fire first for each planted bug of the reference implementations,
from the specification (PROTOCOL.md section 9), shared by the CPU and the GPU conformance tests."""

# Which checks may fire first for each bug, from the specification: a reuse hazard or an unsynchronized
# read shows as wrong bytes or as invariant 2; two writers of a page as invariant 1 (its bytes can even
# be right); a skipped barrier as invariant 4 or a rank left waiting (liveness: a raised timeout); a
# stale plan as wrong bytes, a wrong shape (contract) or an index error; a rank-local overflow verdict
# as invariant 3 or a rank left waiting; an unagreed capability as mismatched collectives (a timeout).
EXPECTED = {
    "single_half": {"bytes", "invariant 2"},
    "no_barrier": {"bytes", "invariant 2"},
    "skip_zero": {"bytes"},
    "token_split": {"invariant 1"},
    "arrive_before_fill": {"bytes", "invariant 2"},
    "skip_idle_barrier": {"invariant 4", "raised", "liveness"},
    "address_keyed_plan_cache": {"bytes", "contract", "raised"},
    "rank_local_overflow": {"invariant 3", "raised", "liveness"},
    # The plan bugs of invariant 9 leave every byte right: only the plan check sees them (section 11).
    "batch_as_one_sequence": {"invariant 9"},
    "causal_off_by_one": {"invariant 9"},
    "key_base_skips_prefix": {"invariant 9"},
    # Last (as in reference.MUTANTS): its timed-out collectives leave the session's gloo group broken.
    "unagreed_capability": {"raised", "liveness", "bytes"},
}
# The bugs whose first check must be exactly invariant 9, with nothing else fired.
PLAN_BUGS = ("batch_as_one_sequence", "causal_off_by_one", "key_base_skips_prefix")

# On a GPU the byte check and the event checker both run; the bugs the GPU test plants are these.
GPU_BUGS = ("single_half", "no_barrier", "skip_zero", "token_split", "arrive_before_fill", "skip_idle_barrier",
            "batch_as_one_sequence", "causal_off_by_one", "key_base_skips_prefix")
