/* p2p_last_error and set_error (error.h): one message per thread, so that concurrent calls keep theirs. */
#include <stdarg.h>
#include <stdio.h>

#include "error.h"

static __thread char last_error[256];

const char *p2p_last_error(void) { return last_error; }

int set_error(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return err < 0 ? err : -err;
}
