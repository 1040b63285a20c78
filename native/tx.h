/* The sending side's units and what they share, on the I/O thread only: txr.c runs each receiver's
 * send (passes, probes, ACKs, close, timers), group.c the send to a multicast group that members
 * follow, batch.c puts a pass's datagrams on the wire, pacer.c paces them, and tx.c drives them all
 * from the I/O loop (its entry points are in io.h: tx_*). */
#ifndef P2P_TX_H
#define P2P_TX_H
#include <stddef.h>

#include "io.h"
#include "send.h"

#define RTO_MIN_NS 5000000ull
#define RTO_MAX_NS 1000000000ull

/* tx.c: s is done (every receiver's send ended): wakes p2p_send_wait. */
void send_complete(p2p_engine *eng, struct p2p_send *s);

/* txr.c: one receiver's send (or the group's, where said) */
void txr_send_probe(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now); /* r may be the group */
void txr_send_join(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now);
/* Ends r's send with `result` (once); a member leaves its group. */
void txr_finish(p2p_engine *eng, struct p2p_send *s, struct txr *r, int result, uint64_t now);
/* Starts r's next pass: what its bounds still need. 0, or -1 out of memory (r then ended). */
int txr_next_pass(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now);
/* Whether r (or the group) may send more before the receiver's ACKs catch up (window_bytes). */
int txr_window_open(const p2p_engine *eng, const struct p2p_send *s, const struct txr *r);
/* r's (unicast) pass went out whole: asks for the receiver's bitmap. */
void txr_pass_sent(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now);
/* Replies from r's receiver: an ACK, a DONE (body of blen bytes from the network, checked here). */
void txr_on_ack(p2p_engine *eng, struct p2p_send *s, struct txr *r, const struct wire_hdr *h, const uint8_t *body,
                size_t blen, uint64_t now);
void txr_on_done(p2p_engine *eng, struct p2p_send *s, struct txr *r, const uint8_t *body, size_t blen, uint64_t now);
void txr_timers(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now);
/* When r next has something to do (r may be the group); UINT64_MAX: nothing. */
uint64_t txr_next_wake(p2p_engine *eng, struct p2p_send *s, struct txr *r, uint64_t now);

/* group.c: s->group and its members (group_check and group_timers do nothing without a group; the
 * others are called only with one) */
/* After a member's state changed: the group's window, start, next pass or end. */
void group_check(p2p_engine *eng, struct p2p_send *s, uint64_t now);
/* A member closed as slow: the group goes at the slowest pace of those still following. */
void group_repace(struct p2p_send *s);
/* A member's ACK (a), after its bitmap was taken; final: it ends the answer to a probe. */
void group_on_ack(p2p_engine *eng, struct p2p_send *s, struct txr *r, const struct ack_body *a, int final,
                  uint64_t now);
void group_timers(p2p_engine *eng, struct p2p_send *s, uint64_t now);
/* The group's pass went out whole. */
void group_pass_sent(p2p_engine *eng, struct p2p_send *s, uint64_t now);
/* Every member goes on by unicast; the group is done. */
void group_dissolve(p2p_engine *eng, struct p2p_send *s, uint64_t now);

#endif
