/* The token bucket of pacer.h. */
#include "pacer.h"

/* Bucket depth: about 2 ms at the rate, so late wake-ups lose no tokens, but at most 32 KB so a
 * shallow switch queue is not overrun; never below a few datagrams. */
static double burst_of(double rate, double dgram) {
    double b = rate * 0.002;
    if (b > 32 * 1024) b = 32 * 1024;
    return b < 4 * dgram ? 4 * dgram : b;
}

void pacer_refill(struct pacer *p, double dgram, uint64_t now) {
    if (p->rate <= 0) return;
    p->tokens += p->rate * (double)(now - p->refill_ns) / 1e9;
    double cap = burst_of(p->rate, dgram);
    if (p->tokens > cap) p->tokens = cap;
    p->refill_ns = now;
}

int pacer_allows(const struct pacer *p, double bytes) {
    return p->rate <= 0 || p->tokens >= bytes;
}

void pacer_pay(struct pacer *p, double bytes) {
    if (p->rate > 0) p->tokens -= bytes;
}

uint64_t pacer_wait(const struct pacer *p, double dgram, double left) {
    if (p->rate <= 0) return 0;
    double need = burst_of(p->rate, dgram) / 2;
    if (left < need) need = left; /* the pass's tail: the tokens it needs, not half a bucket more */
    if (p->tokens >= need) return 0;
    return (uint64_t)((need - p->tokens) / p->rate * 1e9) + 1000;
}
