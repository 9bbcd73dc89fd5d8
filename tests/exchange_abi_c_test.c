/* include/cpkv/exchange_abi.h as a C compiler sees it (C11, -Wall -Wextra -Wpedantic -Werror: the
 * build fails if the header is not plain C), and the layout promises a plugin's author relies on. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cpkv/exchange_abi.h"

_Static_assert(CPKV_EXCHANGE_ABI_VERSION == 1u, "this test describes version 1");
_Static_assert(offsetof(cpkv_exchange_v1_t, abi_version) == 0, "the version comes first, so any version's table can be read for it");
_Static_assert(offsetof(cpkv_exchange_ctx, abi_version) == 0, "the context's version comes first too");
_Static_assert(sizeof(((cpkv_exchange_ctx*)0)->error) == CPKV_ERROR_BYTES, "the error text has the documented size");
_Static_assert(CPKV_OK == 0, "success is 0");
/* Revision 2 of version 1 appends to the context only, after the error text: a plugin built against
 * revision 1 sees the same offsets for every field it knows. */
_Static_assert(offsetof(cpkv_exchange_ctx, produce_rows) > offsetof(cpkv_exchange_ctx, error), "revision 2's fields come after revision 1's last");
_Static_assert(offsetof(cpkv_exchange_ctx, counters) > offsetof(cpkv_exchange_ctx, produce_rows), "in the order the header documents");
_Static_assert(offsetof(cpkv_exchange_ctx, reader_spin_cycles) > offsetof(cpkv_exchange_ctx, counters), "in the order the header documents");
_Static_assert(offsetof(cpkv_exchange_v1_t, flags) == offsetof(cpkv_exchange_v1_t, uses) + sizeof(uint32_t), "flags took reserved's place: the table's size is unchanged");
/* Revision 3 appends the attention plan to the context, after revision 2's last field; the table
 * keeps version 1's size (80 bytes on LP64: the size a plugin of any revision declares in
 * struct_bytes), its new entry being a flag bit and context fields. */
_Static_assert(offsetof(cpkv_exchange_ctx, attention_segments) > offsetof(cpkv_exchange_ctx, reader_spin_cycles), "revision 3's fields come after revision 2's last");
_Static_assert(offsetof(cpkv_exchange_ctx, attention_segment_count) > offsetof(cpkv_exchange_ctx, attention_segments), "in the order the header documents");
/* Revision 4 appends `parts` to the table: a table of revisions 1 to 3 keeps its 80 bytes (LP64),
 * the size such a plugin declares in struct_bytes, and every field it knows keeps its offset. */
_Static_assert(sizeof(void*) != 8 || CPKV_TABLE_BYTES_REVISION_3 == 80, "a table of revisions 1 to 3 is 80 bytes");
_Static_assert(offsetof(cpkv_exchange_v1_t, parts) == offsetof(cpkv_exchange_v1_t, teardown) + sizeof(void*), "parts comes after revision 3's last");
/* Revision 5 appends the all-gather service to the context, after revision 3's last field. */
_Static_assert(offsetof(cpkv_exchange_ctx, all_gather) > offsetof(cpkv_exchange_ctx, attention_segment_count), "revision 5's field comes after revision 3's last");
_Static_assert(CPKV_PART_COUNT <= 32, "every part has a bit in cpkv_exchange_parts.offered");
_Static_assert(offsetof(cpkv_exchange_parts, version) == 0, "the parts' version comes first, so any version's can be read for it");
_Static_assert(sizeof(cpkv_attention_segment) == 5 * sizeof(int64_t), "a segment is five int64 fields, no padding");
_Static_assert((CPKV_FLAG_ATTENTION_PLAN & CPKV_FLAG_REPLAYABLE) == 0, "each flag bit is its own");
_Static_assert((CPKV_USES_PRODUCE & (CPKV_USES_ROWS | CPKV_USES_PLAN | CPKV_USES_INVERSE)) == 0, "each uses bit is its own");

int main(void) {
  if (strcmp(CPKV_EXCHANGE_SYMBOL, "cpkv_exchange_v1") != 0) {
    fprintf(stderr, "symbol name %s, expected cpkv_exchange_v1\n", CPKV_EXCHANGE_SYMBOL);
    return 1;
  }
  /* CPKV_CTX_HAS: a context from a cpkv of revision 1 (ctx_bytes up to the error text) lacks
   * revision 2's fields; one of revision 2 has them. */
  cpkv_exchange_ctx ctx;
  memset(&ctx, 0, sizeof(ctx));
  ctx.ctx_bytes = (uint32_t)offsetof(cpkv_exchange_ctx, produce_rows);
  if (CPKV_CTX_HAS(&ctx, produce_rows) || CPKV_CTX_HAS(&ctx, reader_spin_cycles) || !CPKV_CTX_HAS(&ctx, error)) {
    fprintf(stderr, "CPKV_CTX_HAS is wrong for a revision-1 context of %u bytes\n", ctx.ctx_bytes);
    return 1;
  }
  ctx.ctx_bytes = (uint32_t)sizeof(ctx);
  if (!CPKV_CTX_HAS(&ctx, produce_rows) || !CPKV_CTX_HAS(&ctx, counters) || !CPKV_CTX_HAS(&ctx, reader_spin_cycles)) {
    fprintf(stderr, "CPKV_CTX_HAS is wrong for a revision-2 context of %u bytes\n", ctx.ctx_bytes);
    return 1;
  }
  /* A context of revision 2 (ctx_bytes up to reader_spin_cycles) lacks revision 3's plan. */
  ctx.ctx_bytes = (uint32_t)offsetof(cpkv_exchange_ctx, attention_segments);
  if (CPKV_CTX_HAS(&ctx, attention_segments) || !CPKV_CTX_HAS(&ctx, reader_spin_cycles)) {
    fprintf(stderr, "CPKV_CTX_HAS is wrong for a revision-2 context of %u bytes\n", ctx.ctx_bytes);
    return 1;
  }
  ctx.ctx_bytes = (uint32_t)sizeof(ctx);
  if (!CPKV_CTX_HAS(&ctx, attention_segments) || !CPKV_CTX_HAS(&ctx, attention_segment_count)) {
    fprintf(stderr, "CPKV_CTX_HAS is wrong for a revision-3 context of %u bytes\n", ctx.ctx_bytes);
    return 1;
  }
  /* A context of revision 3 or 4 (ctx_bytes up to the attention plan) lacks revision 5's all_gather. */
  ctx.ctx_bytes = (uint32_t)offsetof(cpkv_exchange_ctx, all_gather);
  if (CPKV_CTX_HAS(&ctx, all_gather) || !CPKV_CTX_HAS(&ctx, attention_segment_count)) {
    fprintf(stderr, "CPKV_CTX_HAS is wrong for a revision-3 context of %u bytes\n", ctx.ctx_bytes);
    return 1;
  }
  ctx.ctx_bytes = (uint32_t)sizeof(ctx);
  if (!CPKV_CTX_HAS(&ctx, all_gather)) {
    fprintf(stderr, "CPKV_CTX_HAS is wrong for a revision-5 context of %u bytes\n", ctx.ctx_bytes);
    return 1;
  }
  ctx.ctx_bytes = (uint32_t)offsetof(cpkv_exchange_ctx, reader_spin_cycles) + 4; /* half a field: not there */
  if (CPKV_CTX_HAS(&ctx, reader_spin_cycles)) {
    fprintf(stderr, "CPKV_CTX_HAS takes a field cut in half for present\n");
    return 1;
  }
  /* CPKV_TABLE_HAS: a table of revision 3 lacks `parts`; one of revision 4 has it. */
  cpkv_exchange_v1_t table;
  memset(&table, 0, sizeof(table));
  table.struct_bytes = CPKV_TABLE_BYTES_REVISION_3;
  if (CPKV_TABLE_HAS(&table, parts) || !CPKV_TABLE_HAS(&table, teardown)) {
    fprintf(stderr, "CPKV_TABLE_HAS is wrong for a revision-3 table of %u bytes\n", table.struct_bytes);
    return 1;
  }
  table.struct_bytes = (uint32_t)sizeof(table);
  if (!CPKV_TABLE_HAS(&table, parts)) {
    fprintf(stderr, "CPKV_TABLE_HAS is wrong for a revision-4 table of %u bytes\n", table.struct_bytes);
    return 1;
  }
  printf("exchange ABI %u: table %zu bytes, context %zu bytes, batch %zu bytes\n", CPKV_EXCHANGE_ABI_VERSION, sizeof(cpkv_exchange_v1_t),
         sizeof(cpkv_exchange_ctx), sizeof(cpkv_batch));
  return 0;
}
