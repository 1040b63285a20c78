/* Pacing: a token bucket in wire bytes (datagram + WIRE_OVERHEAD), one per receiver's send, one per
 * group send and one for the engine's uplink (p2p_config.uplink_rate). A datagram goes out only when
 * every bucket on its way holds its bytes; the I/O thread sleeps until half a bucket is there (or
 * what the pass has left, when less: a small message does not wait for tokens it will not use), so
 * each wake-up sends a batch, not one datagram.
 * Tuning: the bucket depth (pacer.c, burst_of) trades smoothness against wake-ups: about 2 ms at the
 * rate, at most 32 KB (a shallow switch queue), at least 4 datagrams. */
#ifndef P2P_PACER_H
#define P2P_PACER_H
#include <stdint.h>

struct pacer {
    double rate;                  /* wire bytes per second; 0 = unpaced. Set before the I/O thread
                                   * sees it (send.c, api.c); the I/O thread alone changes it after
                                   * (a group's pace when its slowest member leaves) */
    double tokens;                /* wire bytes it may send now (negative: owed); I/O thread only */
    uint64_t refill_ns;           /* when tokens were last added; I/O thread only (set at start) */
};

/* Adds the tokens earned since the last refill, up to the bucket's depth for datagrams of `dgram`
 * wire bytes. Unpaced: nothing. */
void pacer_refill(struct pacer *p, double dgram, uint64_t now);
/* Whether `bytes` may go out now (always, unpaced). */
int pacer_allows(const struct pacer *p, double bytes);
/* Takes what went out from the bucket. */
void pacer_pay(struct pacer *p, double bytes);
/* Nanoseconds until half a bucket of `dgram`-byte datagrams is there, or `left` bytes when fewer
 * are left to send (0 = now, or unpaced). */
uint64_t pacer_wait(const struct pacer *p, double dgram, double left);

#endif
