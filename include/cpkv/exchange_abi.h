/* cpkv exchange plugin ABI, version 1: how an engine team's own CUDA compose exchange runs under
 * cpkv's harness unchanged (`cpkv replay TRACE --backend cuda --exchange ./libmine.so`, likewise
 * `cpkv bench` and `cpkv mutants --backend cuda`).
 *
 * Plain C (C99), no CUDA header: device pointers are `void*`, a stream is the `cudaStream_t`
 * value passed as `void*`. No C++ type crosses this boundary. Section numbers (PROTOCOL.md §N)
 * name the specification, kept beside the repository (../shared/PROTOCOL.md).
 *
 * A plugin is a shared object exporting one symbol, `cpkv_exchange_v1` (CPKV_EXCHANGE_SYMBOL), a
 * `const cpkv_exchange_v1_t` whose `abi_version` is CPKV_EXCHANGE_ABI_VERSION and whose `struct_bytes`
 * is sizeof(cpkv_exchange_v1_t) as the plugin was compiled. cpkv refuses, by name and before any rank
 * starts, a file that is not a shared object, one without the symbol, and one built against another
 * ABI version; it loads the file and checks its table first in a bounded child process, so a plugin
 * whose initializers crash, exit (with any status) or hang is refused in one line too. A later version adds fields only at the end of both structs and bumps the version.
 * Within version 1, cpkv may append fields to the end of cpkv_exchange_ctx, and optional ones to the
 * end of the table: a plugin reads `ctx_bytes` to know whether a field it wants is there
 * (CPKV_CTX_HAS), cpkv reads the table's `struct_bytes` (CPKV_TABLE_HAS), so a plugin built against
 * an earlier revision of this header runs unchanged. Revision 2 appended
 * produce_rows, counters and reader_spin_cycles; revision 3 the attention plan (attention_segments,
 * attention_segment_count), which a plugin returns only where its table's flags say
 * CPKV_FLAG_ATTENTION_PLAN. Revision 4 appended one field to the table, `parts` (the bench's parts,
 * below): a plugin declares the table's size in struct_bytes, and cpkv reads `parts` only from a
 * table whose struct_bytes holds it (CPKV_TABLE_HAS), so a plugin built against revision 1 to 3
 * (struct_bytes CPKV_TABLE_BYTES_REVISION_3) loads and runs as before, with no parts timed.
 * Revision 5 appended one field to the context, `all_gather` (the service section 12's variants
 * gather their token rows with), and gave the batch's own_* fields their meaning for those variants.
 *
 * The bench's parts (optional, versioned on their own: cpkv_exchange_parts, CPKV_EXCHANGE_PARTS_VERSION):
 * `cpkv bench` times every exchange through one path, the plugin host. It always times the table's
 * layer (compose_layer from the host, and as a replayed CUDA graph where the plugin is
 * CPKV_FLAG_REPLAYABLE); a plugin that wants the bench to take its layer apart (fill alone, compose
 * alone, the pre-signal copies alone, the compose without its barrier, the isolated current-page
 * exchange with and without its barrier) offers `parts`, and cpkv times each part it offers the same
 * way, as a replayed CUDA graph of the cycle's layers, after the batch's layers ran and their bytes
 * were checked. A part the plugin does not offer (or a plugin without `parts`) is '-' in the bench's
 * columns. cpkv's own fused exchange (gpu/fused/) offers every part.
 *
 * Life of one rank process (cpkv forks one per rank, rank r on GPU r % gpu_count, sets the device
 * and creates the stream before `setup`):
 *
 *   setup(ctx)                          once; collective calls (alloc_symmetric) only here
 *   for every batch:
 *     begin_batch(ctx)                  ctx->batch is valid from here to end_batch (optional: may be NULL)
 *     for layer in 0..layers-1:
 *       compose_layer(ctx, layer, stream)   enqueue only: no host synchronization needed or wanted
 *     end_batch(ctx)                    after cpkv synchronized the stream; report what the device found
 *   teardown(ctx)                       once
 *
 * After every compose_layer cpkv enqueues its own check on the same stream: every byte of the
 * dense buffer of every kind active on the layer (ctx->dense[half * kind_count + k], half = layer
 * % 2) must equal the specification's expected content (PROTOCOL.md §3, §8), and a wrong byte is
 * reported with rank, batch, layer, kind, slot, row and byte. Every call returns a cpkv_status; on
 * anything but CPKV_OK the plugin writes one line into ctx->error (NUL-terminated, at most
 * CPKV_ERROR_BYTES including the NUL), which cpkv prints, located, and the run fails (exit 1).
 */
#ifndef CPKV_EXCHANGE_ABI_H
#define CPKV_EXCHANGE_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CPKV_EXCHANGE_ABI_VERSION 1u
#define CPKV_EXCHANGE_SYMBOL "cpkv_exchange_v1"
#define CPKV_CP_MAX 8          /* ranks of one node (PROTOCOL.md §1) */
#define CPKV_KINDS_MAX 4       /* buffer kinds per layer */
#define CPKV_ERROR_BYTES 512   /* ctx->error, NUL included */
#define CPKV_SYMMETRIC_MAX 16  /* alloc_symmetric calls per rank */

typedef enum cpkv_status {
  CPKV_OK = 0,
  CPKV_ERROR = 1,    /* anything else went wrong: ctx->error says what */
  CPKV_TIMEOUT = 2,  /* a bounded wait of the plugin gave up: ctx->error names rank, peer and phase (invariant 8) */
  CPKV_OVERFLOW = 3  /* begin_batch (or compose_layer of layer 0, before any write or wait) refuses a batch
                        whose current pages exceed the plugin's staging (PROTOCOL.md §4); every rank must
                        refuse the same batches (invariant 3) */
} cpkv_status;

/* What a plugin reads of the inputs cpkv hands over (cpkv_exchange_v1.uses): the planted bugs that
 * live in the harness (a stale page inverse, a plan reused across batches, rows handed over with
 * their tails not zeroed) apply to a plugin that reads what they corrupt. */
#define CPKV_USES_ROWS 1u     /* ctx->rows */
#define CPKV_USES_PLAN 2u     /* ctx->batch->plan_table_index / plan_source_page */
#define CPKV_USES_INVERSE 4u  /* ctx->batch->own_current_index */
#define CPKV_USES_PRODUCE 8u  /* ctx->produce_rows: the layer's rows written where the plugin wants them, as the model's own
                                 KV write lands in the exchange's buffer; cpkv then writes no ctx->rows (NULL) unless
                                 CPKV_USES_ROWS is set too */

/* What a plugin declares of itself (cpkv_exchange_v1.flags). */
#define CPKV_FLAG_REPLAYABLE 1u  /* what compose_layer enqueues may be captured into a CUDA graph and replayed as is: it makes
                                    no host synchronization, and what changes from one launch to the next (a barrier's phase)
                                    lives on the device. `cpkv bench` then also times the layer as a replayed graph, as cpkv
                                    times its own exchange (the "plugin with fill" row) */
#define CPKV_FLAG_ATTENTION_PLAN 2u  /* the plugin returns its attention plan (PROTOCOL.md §11) of every batch it runs, in
                                        ctx->attention_segments (revision 3 of the context); cpkv checks it (invariant 9).
                                        Without the flag cpkv reads no plan: a plugin built before revision 3 loads as it did */

/* Whether the context cpkv handed over holds `field` (appended in a later revision of version 1). */
#define CPKV_CTX_HAS(ctx, field) \
  ((ctx)->ctx_bytes >= (uint32_t)((const char*)&(ctx)->field - (const char*)(ctx)) + (uint32_t)sizeof((ctx)->field))

/* One segment of a rank's attention plan in the neutral form (PROTOCOL.md §11): its queries are the
 * current tokens q_base .. q_base + q_len - 1 of request `request` (offsets within the request's
 * extend), packed in the rank's query order; the last of them sees kv_len keys (prefix_len + q_base
 * + q_len: causal, per request); key j of the request is dense row k_base + j (the request's first
 * prefix row, or its first current row when it has no prefix). */
typedef struct cpkv_attention_segment {
  int64_t request;
  int64_t q_base;
  int64_t q_len;
  int64_t kv_len;
  int64_t k_base;
} cpkv_attention_segment;

/* One buffer kind (PROTOCOL.md §1): main KV, indexer K, ... */
typedef struct cpkv_kind {
  const char* name;         /* "kv_fp8", "indexer_k", ... */
  uint32_t row_bytes;       /* bytes per token row */
  uint32_t reserved;
  const uint8_t* active;    /* host, [layers]: 1 where the kind is on the layer (the layer pattern) */
} cpkv_kind;

/* One symmetric allocation: this rank's pointer and every rank's (own included), device memory. */
typedef struct cpkv_symmetric {
  void* local;
  void* peers[CPKV_CP_MAX];
  uint64_t bytes;
} cpkv_symmetric;

/* The batch in flight (valid from begin_batch to end_batch). Host arrays describe it (PROTOCOL.md
 * §1-3); device arrays are cpkv's own plan and this rank's page inverse, for plugins that want them. */
typedef struct cpkv_batch {
  int64_t index;                      /* 0-based in the trace */
  int32_t requests;
  int32_t reserved;
  const int64_t* prefix_len;          /* host [requests]: a multiple of page_size */
  const int64_t* extend_len;          /* host [requests]: >= 1 */
  const int64_t* page_table_begin;    /* host [requests + 1]: request r's prefix pages are page_table[begin[r] .. begin[r+1]) */
  const int64_t* page_table;          /* host: logical page ids (page g lives on rank g % cp at local page g / cp) */
  const char* json;                   /* the batch as its trace line (traces/README.md) */
  int64_t slot_count;                 /* dense slots of this batch, merged-span order (§3) */
  int64_t current_pages;              /* current_pages_total (§2-3) */
  int64_t staging_slots;              /* cpkv's staging capacity for the setting's caps (§4) */
  int32_t overflow;                   /* 1: current_pages > staging_slots (cpkv's verdict; the plugin decides its own) */
  int32_t reserved2;
  /* cpkv's staging_direct compose plan (§5), device [slot_count]: table_index in 0..2cp-1 (pool of
   * rank t, or staging of rank t - cp), source_page (a local pool page, or a current index in the
   * layer's staging half). */
  const int32_t* plan_table_index;
  const int64_t* plan_source_page;
  const int32_t* writer;              /* device [current_pages]: the writer rank of each current index (§2) */
  const int64_t* current_slot;        /* device [current_pages]: its dense slot */
  /* This rank's page inverse (§5): the current pages it writes, in current-index order. Where the
   * path variant splits tokens (PROTOCOL.md §12: allgather_zigzag, allgather_continuous; revision 5)
   * they describe this rank's send rows instead: row j*P+o is its (j*P+o)-th token in its query
   * order (request by request, ascending), padded with rows of no token (-1) to a whole number of
   * pages past the largest rank's token count (max_rank_tokens, the all-gather's rows per rank);
   * own_pages is those pages and own_current_index[j] is -1 (a send page is no current page). The
   * producer (produce_rows, ctx->rows) writes these rows, padding zero. */
  int64_t own_pages;
  const int64_t* own_current_index;   /* device [own_pages]: the current index of own page j */
  const int32_t* row_request;         /* device [own_pages * page_size]: request of row j*P+o, -1 past its end */
  const int64_t* row_token;           /* device [own_pages * page_size]: token index in the request (prefix included), -1 past its end */
} cpkv_batch;

/* What a plugin counts of its own traffic for cpkv's report (cpkv sees neither a foreign exchange's
 * barriers nor where its gathers read; it counts the all_reduce_sum calls and their bytes itself).
 * The plugin adds to these on the host as it enqueues; cpkv reads them after each batch's layers and
 * reports them as the plugin's own. Zero where the plugin counts nothing. */
typedef struct cpkv_counters {
  uint64_t bytes_gathered_from_peers; /* bytes its copies read from other ranks' memory (pools, staging, dense) */
  uint64_t barriers;                  /* group barriers it issued (PROTOCOL.md §5 step 3) */
  uint64_t reserved[6];
} cpkv_counters;

typedef struct cpkv_exchange_ctx cpkv_exchange_ctx;

struct cpkv_exchange_ctx {
  uint32_t abi_version;               /* CPKV_EXCHANGE_ABI_VERSION */
  uint32_t ctx_bytes;                 /* sizeof(cpkv_exchange_ctx) as cpkv was compiled */
  /* The group and the run (§1). */
  int32_t rank, cp, device;           /* device: the CUDA ordinal this process uses (set current) */
  int32_t layers;                     /* layers run per batch */
  uint64_t seed;                      /* the content seed (§8): a plugin may compute rows itself */
  const char* variant;                /* the variant asked for: one of the plugin's `variants` */
  const char* path_variant;           /* the variant the group agreed to run (differs where the IPC capability is missing, §7) */
  int32_t ipc_capable;                /* the group's agreed capability (a MIN over ranks, §7) */
  int32_t page_size;                  /* P */
  int32_t kind_count;
  int32_t reserved;
  const cpkv_kind* kinds;             /* host [kind_count] */
  const char* setting_json;           /* the setting as the trace header's JSON */
  const char* mutant;                 /* a planted bug the plugin holds itself (`mutants`), or "none" */
  int64_t pool_pages_per_rank;
  int64_t staging_slots;              /* cpkv's staging capacity for the setting's caps (§4), per half and kind */
  int64_t slot_count_max;             /* the largest batch's slots: the dense buffers' capacity */
  int64_t current_pages_max;          /* the largest batch's current pages */
  int64_t wait_ms_max;                /* the bound for the plugin's own host waits; device waits: a few seconds */
  /* The pool (§1), prefilled by cpkv at each page's storage owner: rank p's slab is pool[p]; layer l,
   * kind k, local page q at pool[p] + pool_offset[l * kind_count + k] + q * page_size * row_bytes.
   * The slabs are reserved whole but only the pages some batch of the run references have memory
   * behind them (2-MiB chunks; CPKV_POOL_MEMORY=dense allocates every page): read only the pages
   * a batch's plan names. */
  void* const* pool;                  /* host [cp] of device pointers (own slab included) */
  const uint64_t* pool_offset;        /* host [layers * kind_count] */
  /* The dense buffers the plugin must produce (§3), per parity half and kind, slot_count_max slots
   * each; they are one symmetric allocation: rank p's copy of dense[i] is dense_peer[p] + dense_offset[i]. */
  void* const* dense;                 /* host [2 * kind_count] of device pointers */
  void* const* dense_peer;            /* host [cp]: every rank's dense allocation */
  const uint64_t* dense_offset;       /* host [2 * kind_count] */
  /* One flag pad per rank (§5 step 3): CPKV_CP_MAX zeroed uint64 words of device memory, every
   * rank's mapped; pad_table is a device array of the cp pads (for a kernel to index). */
  uint64_t* flag_pad;
  uint64_t* const* flag_pads;         /* host [cp] */
  uint64_t* const* flag_pad_table;    /* device [cp] */
  /* The batch in flight (NULL outside begin_batch..end_batch). */
  const cpkv_batch* batch;
  /* This layer's current rows of the pages this rank writes (the stand-in for the model's KV write,
   * §8), valid during compose_layer: rows[k] is a device buffer of own_pages * page_size rows of
   * kinds[k].row_bytes, own page j's rows at j * page_size, rows past a request's end zero. */
  const void* const* rows;            /* host [kind_count] of device pointers (NULL for a kind off the layer) */
  /* Services. alloc_symmetric is collective: every rank calls it in the same order, from setup
   * only; the memory is poisoned (0xA5) and stays until teardown. all_reduce_sum sums bytes (uint8,
   * wrapping) of a range inside the dense buffers or a symmetric allocation over the group, in
   * place, enqueued on `stream` (NCCL with one GPU per rank, IPC otherwise). */
  cpkv_status (*alloc_symmetric)(cpkv_exchange_ctx* ctx, uint64_t bytes, cpkv_symmetric* out);
  cpkv_status (*all_reduce_sum)(cpkv_exchange_ctx* ctx, void* buffer, uint64_t bytes, void* stream);
  void* plugin_state;                 /* the plugin's own, untouched by cpkv */
  void* harness;                      /* cpkv's own, opaque */
  char error[CPKV_ERROR_BYTES];       /* the plugin's one-line error text */
  /* Revision 2 of version 1 (test with CPKV_CTX_HAS). */
  /* produce_rows (for a plugin whose `uses` has CPKV_USES_PRODUCE; during compose_layer, on its
   * stream): cpkv's producer writes this layer's current rows of this rank's pages straight into the
   * plugin's memory, the stand-in for the model's KV write (§8), with no copy through ctx->rows. For
   * every kind k on the layer with dest[k] non-NULL (host [kind_count] of device pointers): own page j
   * (ctx->batch->own_current_index order) lands at dest[k] + dest_page[j] * page_size * row_bytes
   * (dest_page: device [own_pages]). Rows past a request's end are zeroed when zero_tails is 1 and left
   * as they are when it is 0 (for an exchange that zeroes them otherwise, e.g. a memset of the dense
   * buffer; the harness's planted bug unzeroed_rows forces 0). The producer reads dest_page when it
   * runs: for a CPKV_FLAG_REPLAYABLE plugin, dest and dest_page must stay valid through every replay
   * of the batch's layers, until end_batch. */
  cpkv_status (*produce_rows)(cpkv_exchange_ctx* ctx, void* const* dest, const int64_t* dest_page, int32_t zero_tails, void* stream);
  cpkv_counters counters;             /* the plugin's own counts, above */
  /* A test knob (cpkv's closing-wait test): this rank should spin about this many cycles between its
   * barrier and its first read of a peer's current pages, so a peer that passes the next layer's
   * closing wait early overwrites pages it still reads. 0: none. A plugin may ignore it. */
  int64_t reader_spin_cycles;
  /* Revision 3 of version 1: the attention plan, for a plugin whose flags have CPKV_FLAG_ATTENTION_PLAN.
   * cpkv sets them to NULL and -1 (none returned) before begin_batch; the plugin sets them, for a
   * batch it runs, at any point from begin_batch to its last compose_layer: this rank's segments, in
   * its query order (a count of 0 for a rank with no query), in host memory of its own that stays
   * valid until end_batch is called. cpkv reads them after the
   * batch's layers (the stream synchronized, before end_batch) and checks them against the
   * specification (PROTOCOL.md §11: this rank's queries are the current rows it writes, the page
   * split of §2), then their coverage over the group (every current token a query on exactly one
   * rank): a wrong plan, or none, is invariant 9's violation with the checker's line. */
  const cpkv_attention_segment* attention_segments;
  int64_t attention_segment_count;
  /* Revision 5 of version 1: the all-gather service (section 12's token-split variants; test with
   * CPKV_CTX_HAS(ctx, all_gather)). all_gather(ctx, send, recv, bytes, stream) gathers every rank's
   * `bytes` at `send` into `recv`: rank p's land at recv + p * bytes, this rank's own included,
   * enqueued on `stream` (the one compose_layer or enqueue_part was given). `send .. send + bytes`
   * must lie inside the dense buffers or a symmetric allocation (peers read it there), and `recv ..
   * recv + cp * bytes` inside one too, apart from `send`. Collective: every rank makes the same
   * calls with the same `bytes`. With one GPU per rank it is NCCL's all-gather (ncclAllGather);
   * where ranks share a GPU (NCCL refuses two ranks on one device) it is cpkv's over CUDA IPC: a
   * device barrier (every rank's send bytes written), a copy of each peer's bytes from its mapping,
   * a second barrier (no rank rewrites its send bytes while a peer still reads them). cpkv counts
   * the calls as collectives. A path variant of section 12 (ctx->path_variant allgather_zigzag or
   * allgather_continuous) also changes what the batch's own_* fields describe: see cpkv_batch. */
  cpkv_status (*all_gather)(cpkv_exchange_ctx* ctx, const void* send, void* recv, uint64_t bytes, void* stream);
};

/* The bench's parts of one layer (cpkv_exchange_parts.enqueue_part's `part`). */
typedef enum cpkv_part {
  CPKV_PART_FILL = 0,                  /* the producer alone: the layer's rows written where the exchange reads them */
  CPKV_PART_COMPOSE = 1,               /* the layer without its fill (zeroing, compose, all-reduces, unpack); the fill is
                                          the one the layer's replays before it left */
  CPKV_PART_PRE_SIGNAL = 2,            /* the copies the exchange makes before it signals its barrier (a publish, a pack),
                                          launched alone, no barrier; nothing where it has none */
  CPKV_PART_NO_BARRIER = 3,            /* the compose with its barrier taken out (its bytes may be stale); nothing where it
                                          has no barrier */
  CPKV_PART_ISOLATED = 4,              /* only the current pages moved between ranks, with their barrier or all-reduce;
                                          nothing where the exchange has no such step */
  CPKV_PART_ISOLATED_NO_BARRIER = 5,   /* the same without the barrier (the barrier's share is the difference) */
  CPKV_PART_COUNT = 6
} cpkv_part;

#define CPKV_EXCHANGE_PARTS_VERSION 1u
#define CPKV_PART_BIT(part) (1u << (part))

/* The bench's parts a plugin offers (cpkv_exchange_v1.parts, revision 4; may be NULL). cpkv refuses,
 * at load, a `parts` of another version or size, with an unknown bit in `offered`, without
 * enqueue_part, or in a table without CPKV_FLAG_REPLAYABLE (the parts are timed as replayed graphs).
 * enqueue_part(ctx, part, layer, stream): enqueue part `part` of layer `layer` on `stream`, with no
 * host synchronization (it is captured into a CUDA graph and replayed, as compose_layer of a
 * CPKV_FLAG_REPLAYABLE plugin is); called between begin_batch and end_batch of a batch whose layers
 * ran, only for parts in `offered`, and on every rank alike. Timing only: what it leaves in the dense
 * buffers is not checked, but every barrier it issues must be met by every rank's same call and
 * leave its flags drained at teardown. A part the layer does not have enqueues nothing (its figure
 * is then '-'). */
typedef struct cpkv_exchange_parts {
  uint32_t version;                   /* CPKV_EXCHANGE_PARTS_VERSION */
  uint32_t struct_bytes;              /* sizeof(cpkv_exchange_parts) */
  uint32_t offered;                   /* CPKV_PART_BIT(part) for every part it times */
  uint32_t reserved;
  cpkv_status (*enqueue_part)(cpkv_exchange_ctx* ctx, int32_t part, int32_t layer, void* stream);
} cpkv_exchange_parts;

typedef struct cpkv_exchange_v1_t {
  uint32_t abi_version;               /* CPKV_EXCHANGE_ABI_VERSION */
  uint32_t struct_bytes;              /* sizeof(cpkv_exchange_v1_t) */
  const char* name;                   /* one word, for reports */
  const char* const* variants;        /* NULL-terminated: the variants it implements (§7 names) */
  const char* const* mutants;         /* NULL-terminated planted bugs it holds itself (ctx->mutant); may be NULL */
  uint32_t uses;                      /* CPKV_USES_* */
  uint32_t flags;                     /* CPKV_FLAG_* (0 in revision 1, where it was `reserved`) */
  cpkv_status (*setup)(cpkv_exchange_ctx* ctx);
  cpkv_status (*begin_batch)(cpkv_exchange_ctx* ctx);  /* may be NULL */
  cpkv_status (*compose_layer)(cpkv_exchange_ctx* ctx, int32_t layer, void* stream);
  cpkv_status (*end_batch)(cpkv_exchange_ctx* ctx);
  cpkv_status (*teardown)(cpkv_exchange_ctx* ctx);
  /* Revision 4 of version 1 (present where CPKV_TABLE_HAS(table, parts)): the bench's parts, or NULL. */
  const cpkv_exchange_parts* parts;
} cpkv_exchange_v1_t;

/* The struct_bytes of a table built against revisions 1 to 3 of version 1 (no `parts`). */
#define CPKV_TABLE_BYTES_REVISION_3 ((uint32_t)offsetof(cpkv_exchange_v1_t, parts))
/* Whether a table declares `field` (appended in a later revision of version 1). */
#define CPKV_TABLE_HAS(table, field) \
  ((table)->struct_bytes >= (uint32_t)((const char*)&(table)->field - (const char*)(table)) + (uint32_t)sizeof((table)->field))

#ifdef __cplusplus
}
#endif

#endif /* CPKV_EXCHANGE_ABI_H */
