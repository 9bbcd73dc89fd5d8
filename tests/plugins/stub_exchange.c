/* Test plugins for the loader (tests/exchange_plugin_test.cpp) and for a plugin that fails
 * (tests/gpu_plugin_test.cpp), built from this one C file with one define each:
 *   (none)             a valid table whose setup fails with a located error text
 *   STUB_VERSION=N     a table claiming ABI version N
 *   STUB_NO_SYMBOL     exports cpkv_exchange_v0 instead of cpkv_exchange_v1
 *   STUB_BAD_VARIANT   names a variant cpkv does not have
 *   STUB_NO_COMPOSE    leaves compose_layer NULL
 *   STUB_FLAGS=N       declares flags N (CPKV_FLAG_*; an unknown bit is refused) */
#include <stdio.h>

#include "cpkv/exchange_abi.h"

#ifndef STUB_VERSION
#define STUB_VERSION CPKV_EXCHANGE_ABI_VERSION
#endif

static cpkv_status stub_setup(cpkv_exchange_ctx* ctx) {
  snprintf(ctx->error, CPKV_ERROR_BYTES, "stub: rank %d refuses to set up (a test plugin)", ctx->rank);
  return CPKV_ERROR;
}
static cpkv_status stub_compose(cpkv_exchange_ctx* ctx, int32_t layer, void* stream) {
  (void)ctx;
  (void)layer;
  (void)stream;
  return CPKV_ERROR;
}
static cpkv_status stub_ok(cpkv_exchange_ctx* ctx) {
  (void)ctx;
  return CPKV_OK;
}

#ifdef STUB_BAD_VARIANT
static const char* const stub_variants[] = {"staging_direct", "warp_drive", NULL};
#else
static const char* const stub_variants[] = {"staging_direct", "v2", NULL};
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

__attribute__((visibility("default"))) const cpkv_exchange_v1_t STUB_SYMBOL = {
    STUB_VERSION, sizeof(cpkv_exchange_v1_t), "stub", stub_variants, NULL, CPKV_USES_PLAN, STUB_FLAGS, stub_setup, NULL, STUB_COMPOSE, stub_ok, stub_ok};
