/* What group.c needs of context.c beyond the public calls. */
#ifndef COLONY_CTX_CHECK_H
#define COLONY_CTX_CHECK_H

#include "base/base.h"

/* Stop with a fatal line naming `call` unless c (not NULL) is a live
 * context (its tag: chan/chan.h). */
CO_HIDDEN void co__ctx_check(const co_ctx_t *c, const char *call);

#endif
