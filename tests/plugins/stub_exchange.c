/* Test plugins for the loader (tests/exchange_plugin_test.cpp) and for plugins that fail or lie
 * (tests/gpu_plugin_test.cpp), built from this one C file with one define each (tests/CMakeLists.txt):
 *   (none)             a valid table whose setup fails with a located error text
 *   STUB_VERSION=N     a table claiming ABI version N
 *   STUB_NO_SYMBOL     exports cpkv_exchange_v0 instead of cpkv_exchange_v1
 *   STUB_BAD_VARIANT   names a variant cpkv does not have
 *   STUB_NO_COMPOSE    leaves compose_layer NULL
 *   STUB_FLAGS=N       declares flags N (CPKV_FLAG_*; an unknown bit is refused)
 *   STUB_REVISION_3    a table as built against revisions 1 to 3 of the header (struct_bytes without
 *                      `parts`), with a wild pointer where `parts` would be: cpkv must not read it
 *   STUB_PARTS=N       offers the bench's parts (cpkv_exchange_parts): 1 valid (fill and compose,
 *                      CPKV_FLAG_REPLAYABLE), 2 of parts version 2, 3 without CPKV_FLAG_REPLAYABLE
 * What runs when it is loaded (its initializer) or read:
 *   STUB_INIT_CRASH    the initializer dies from SIGSEGV
 *   STUB_INIT_EXIT     the initializer calls exit(0)
 *   STUB_INIT_HANG     the initializer never returns
 *   STUB_WILD_NAME     the table's name is a wild pointer (reading it crashes)
 *   STUB_WILD_ENTRY    the table's setup points into no loaded object
 * The planted bugs it declares (STUB_MUTANTS=N):
 *   1: address_keyed_plan_cache (a bug of the protocol's: a plugin may hold it)
 *   2: unzeroed_rows (the harness's own: a plugin cannot)
 *   3: a name declared twice
 * Plugins that run (on a GPU), their setup succeeding:
 *   STUB_SETUP_OK      composes nothing: the dense buffers keep cpkv's poison
 *   STUB_REFUSE_RANK1  begin_batch refuses every batch as an overflow on rank 1 only
 *   STUB_EXIT_COMPOSE  compose_layer calls exit(0)
 *   STUB_UNDERSCORE_EXIT_BEGIN  begin_batch calls _exit(0) (no exit handler runs)
 *   STUB_ATTENTION=1   declares CPKV_FLAG_ATTENTION_PLAN and returns no plan
 *   STUB_ATTENTION=2   declares it and returns a wild pointer as its plan (3 segments at address 16) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpkv/exchange_abi.h"

#ifndef STUB_VERSION
#define STUB_VERSION CPKV_EXCHANGE_ABI_VERSION
#endif
#if defined(STUB_REFUSE_RANK1) || defined(STUB_EXIT_COMPOSE) || defined(STUB_UNDERSCORE_EXIT_BEGIN) || defined(STUB_ATTENTION)
#define STUB_SETUP_OK /* each needs a rank that gets past setup */
#endif
#ifdef STUB_ATTENTION
#define STUB_FLAGS CPKV_FLAG_ATTENTION_PLAN
#endif

#if defined(STUB_INIT_CRASH) || defined(STUB_INIT_EXIT) || defined(STUB_INIT_HANG)
__attribute__((constructor)) static void stub_init(void) {
#if defined(STUB_INIT_CRASH)
  raise(SIGSEGV);
#elif defined(STUB_INIT_EXIT)
  exit(0);
#else
  for (;;) pause();
#endif
}
#endif

__attribute__((unused)) static cpkv_status stub_setup(cpkv_exchange_ctx* ctx) {  /* unused by STUB_WILD_ENTRY */
#ifdef STUB_SETUP_OK
  (void)ctx;
  return CPKV_OK;
#else
  snprintf(ctx->error, CPKV_ERROR_BYTES, "stub: rank %d refuses to set up (a test plugin)", ctx->rank);
  return CPKV_ERROR;
#endif
}
__attribute__((unused)) static cpkv_status stub_compose(cpkv_exchange_ctx* ctx, int32_t layer, void* stream) {  /* unused by STUB_NO_COMPOSE */
  (void)layer;
  (void)stream;
#ifdef STUB_EXIT_COMPOSE
  exit(0);
#endif
#ifdef STUB_SETUP_OK
  (void)ctx;
  return CPKV_OK;
#else
  (void)ctx;
  return CPKV_ERROR;
#endif
}
#if defined(STUB_REFUSE_RANK1) || defined(STUB_UNDERSCORE_EXIT_BEGIN) || defined(STUB_ATTENTION)
#define STUB_BEGIN stub_begin
static cpkv_status stub_begin(cpkv_exchange_ctx* ctx) {
#ifdef STUB_UNDERSCORE_EXIT_BEGIN
  _exit(0);
#endif
#if defined(STUB_ATTENTION) && STUB_ATTENTION == 2
  ctx->attention_segments = (const cpkv_attention_segment*)16;
  ctx->attention_segment_count = 3;
#endif
#ifdef STUB_REFUSE_RANK1
  if (ctx->rank == 1) {
    snprintf(ctx->error, CPKV_ERROR_BYTES, "stub: rank 1 refuses batch %lld", (long long)ctx->batch->index);
    return CPKV_OVERFLOW;
  }
#endif
  (void)ctx;
  return CPKV_OK;
}
#else
#define STUB_BEGIN NULL /* begin_batch may be NULL */
#endif
static cpkv_status stub_ok(cpkv_exchange_ctx* ctx) {
  (void)ctx;
  return CPKV_OK;
}

#ifdef STUB_BAD_VARIANT
static const char* const stub_variants[] = {"staging_direct", "warp_drive", NULL};
#else
static const char* const stub_variants[] = {"staging_direct", "v2", NULL};
#endif

#if !defined(STUB_MUTANTS)
#define STUB_MUTANT_LIST NULL
#else
#if STUB_MUTANTS == 1
static const char* const stub_mutants[] = {"address_keyed_plan_cache", NULL};
#elif STUB_MUTANTS == 2
static const char* const stub_mutants[] = {"unzeroed_rows", NULL};
#else
static const char* const stub_mutants[] = {"no_barrier", "no_barrier", NULL};
#endif
#define STUB_MUTANT_LIST stub_mutants
#endif

#ifdef STUB_NO_SYMBOL
#define STUB_SYMBOL cpkv_exchange_v0
#else
#define STUB_SYMBOL cpkv_exchange_v1
#endif

#ifndef STUB_FLAGS
#define STUB_FLAGS 0u
#endif

#ifdef STUB_NO_COMPOSE
#define STUB_COMPOSE NULL
#else
#define STUB_COMPOSE stub_compose
#endif

#ifdef STUB_WILD_NAME
#define STUB_NAME ((const char*)16)
#else
#define STUB_NAME "stub"
#endif

#ifdef STUB_WILD_ENTRY
#define STUB_SETUP ((cpkv_status(*)(cpkv_exchange_ctx*))16)
#else
#define STUB_SETUP stub_setup
#endif

#if defined(STUB_PARTS)
static cpkv_status stub_part(cpkv_exchange_ctx* ctx, int32_t part, int32_t layer, void* stream) {
  (void)ctx;
  (void)part;
  (void)layer;
  (void)stream;
  return CPKV_OK;
}
static const cpkv_exchange_parts stub_parts = {STUB_PARTS == 2 ? 2u : CPKV_EXCHANGE_PARTS_VERSION, sizeof(cpkv_exchange_parts),
                                               CPKV_PART_BIT(CPKV_PART_FILL) | CPKV_PART_BIT(CPKV_PART_COMPOSE), 0u, stub_part};
#define STUB_PARTS_TABLE (&stub_parts)
#undef STUB_FLAGS
#define STUB_FLAGS (STUB_PARTS == 3 ? 0u : CPKV_FLAG_REPLAYABLE)
#elif defined(STUB_REVISION_3)
#define STUB_PARTS_TABLE ((const cpkv_exchange_parts*)16)
#else
#define STUB_PARTS_TABLE NULL
#endif

#ifdef STUB_REVISION_3
#define STUB_TABLE_BYTES CPKV_TABLE_BYTES_REVISION_3
#else
#define STUB_TABLE_BYTES sizeof(cpkv_exchange_v1_t)
#endif

__attribute__((visibility("default"))) const cpkv_exchange_v1_t STUB_SYMBOL = {
    STUB_VERSION, STUB_TABLE_BYTES, STUB_NAME, stub_variants, STUB_MUTANT_LIST, CPKV_USES_PLAN, STUB_FLAGS, STUB_SETUP, STUB_BEGIN, STUB_COMPOSE,
    stub_ok, stub_ok, STUB_PARTS_TABLE};
