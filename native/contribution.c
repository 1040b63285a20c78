/* The one check of a contribution's lengths (contribution.h). */
#include <errno.h>

#include "compute.h"
#include "contribution.h"
#include "error.h"

int contribution_check(const p2p_contribution *c, uint64_t n, uint32_t i, const char *what) {
    if (c->dtype < P2P_F32 || c->dtype > P2P_I4)
        return set_error(EINVAL, "%s: contribution %u has unknown dtype %d", what, i, c->dtype);
    if (n && !c->values) return set_error(EINVAL, "%s: contribution %u has no values", what, i);
    if (c->values_bytes < value_bytes(c->dtype, n))
        return set_error(EINVAL, "%s: contribution %u has %llu bytes of values, %llu elements need %llu", what, i,
                         (unsigned long long)c->values_bytes, (unsigned long long)n,
                         (unsigned long long)value_bytes(c->dtype, n));
    if (c->dtype == P2P_I8 || c->dtype == P2P_I4) {
        if (!c->scales || !c->block) return set_error(EINVAL, "%s: contribution %u has no scales", what, i);
        uint64_t blocks = n / c->block + (n % c->block != 0);
        if (c->nscales < blocks)
            return set_error(EINVAL, "%s: contribution %u has %llu scales, %llu elements need %llu", what, i,
                             (unsigned long long)c->nscales, (unsigned long long)n, (unsigned long long)blocks);
    }
    if (!c->chunk_arrived || !n) return 0;
    if (!c->chunk_size) return set_error(EINVAL, "%s: contribution %u has chunk_size 0", what, i);
    uint64_t last_byte = c->first_byte + value_bytes(c->dtype, n) - 1;
    if (last_byte < c->first_byte || last_byte / c->chunk_size >= c->nchunks)
        return set_error(EINVAL, "%s: contribution %u reaches past its %llu chunks", what, i,
                         (unsigned long long)c->nchunks);
    return 0;
}
