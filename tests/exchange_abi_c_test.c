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

int main(void) {
  if (strcmp(CPKV_EXCHANGE_SYMBOL, "cpkv_exchange_v1") != 0) {
    fprintf(stderr, "symbol name %s, expected cpkv_exchange_v1\n", CPKV_EXCHANGE_SYMBOL);
    return 1;
  }
  printf("exchange ABI %u: table %zu bytes, context %zu bytes, batch %zu bytes\n", CPKV_EXCHANGE_ABI_VERSION, sizeof(cpkv_exchange_v1_t),
         sizeof(cpkv_exchange_ctx), sizeof(cpkv_batch));
  return 0;
}
