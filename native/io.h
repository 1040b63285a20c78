/* The I/O thread's units and what they share: io.c runs the loop, datagram.c reads and checks
 * what the sockets received and sends control datagrams, tx.c sends this peer's messages (with
 * txr.c, group.c, batch.c and pacer.c: tx.h), rx.c reassembles the messages it receives (with
 * rx_store.c, which holds them, and rx_ack.c, which answers their senders).
 * Everything declared here runs on the I/O thread only. */
#ifndef P2P_IO_H
#define P2P_IO_H
#include <stddef.h>

#include "engine.h"

/* A timer ACK only reports a stream that paused (a pass ends with a probe, answered at once); a
 * shorter delay ACKs every datagram of a slow flow, and those ACKs crowd the receiver's own uplink. */
#define ACK_DELAY_NS 20000000ull

static inline int same_addr(const struct sockaddr_in *a, const struct sockaddr_in *b) {
    return a->sin_addr.s_addr == b->sin_addr.s_addr && a->sin_port == b->sin_port;
}

/* datagram.c */
/* Reads what socket fd holds; via_group: it is eng->mc.fd, where only DATA and PROBE are taken. */
void dgram_drain(p2p_engine *eng, int fd, int via_group);
void dgram_send_ctl(p2p_engine *eng, const struct sockaddr_in *to, struct wire_hdr *h, const uint8_t *body,
                    size_t blen);

/* tx.c: sends */
void tx_take_commands(p2p_engine *eng, uint64_t now);
int tx_pump(p2p_engine *eng, uint64_t now);
void tx_on_reply(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, const uint8_t *body,
                 size_t blen, uint64_t now);
void tx_timers(p2p_engine *eng, uint64_t now);
uint64_t tx_next_wake(p2p_engine *eng, uint64_t now, uint64_t wake);
void tx_reap(p2p_engine *eng);
void tx_cancel_all(p2p_engine *eng, uint64_t now);

/* rx.c: incoming messages */
void rx_on_data(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, const uint8_t *payload,
                size_t len, int via_group, uint64_t now);
void rx_on_join(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, const uint8_t *body,
                size_t blen, uint64_t now);
void rx_on_probe_or_close(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src,
                          const uint8_t *body, size_t blen, int via_group, uint64_t now);
void rx_timers(p2p_engine *eng, uint64_t now);
uint64_t rx_next_wake(const p2p_engine *eng, uint64_t wake);

/* rx_store.c: the partial messages (eng->rxs) */
/* A new message for h's geometry from src, made room for within the quotas; NULL: it can never
 * fit, or out of memory. */
struct rx *rx_create(p2p_engine *eng, const struct wire_hdr *h, const struct sockaddr_in *src, uint64_t now);
struct rx *rx_find(p2p_engine *eng, uint16_t sender, uint32_t msg, const struct sockaddr_in *src);
/* The message's meta, decoded and checked (wire_get_meta): 0, or -1 when it is invalid. */
int rx_get_meta(const struct rx *m, struct wire_meta *meta);
/* Hands m to the delivery queue with `reason` (P2P_DELIVERED_*) and leaves its tombstone; frees m
 * (out of memory: only that). */
void rx_deliver(p2p_engine *eng, struct rx *m, int reason, uint64_t now);
/* Takes m off the list and frees it (and its buffers, unless a delivery took them). */
void rx_unlink_free(p2p_engine *eng, struct rx *m);
void rx_free_all(p2p_engine *eng);

/* rx_ack.c: answers to a message's sender, and tombstones */
/* Sends one ACK slice of m's bitmap; 0 when anti-amplification holds it back (counted). */
int rx_send_ack(p2p_engine *eng, struct rx *m, uint32_t start, uint32_t nbits, uint16_t flags, uint64_t now);
/* A periodic ACK: the stretch of the bitmap that this pass's latest chunks fall in. */
void rx_ack_recent(p2p_engine *eng, struct rx *m, uint64_t now);
/* A probe answer: the whole bitmap (or what the message paid for), the last slice flagged FINAL. */
void rx_ack_all(p2p_engine *eng, struct rx *m, uint64_t now);
void rx_send_done(p2p_engine *eng, uint32_t msg, const struct sockaddr_in *to, uint32_t flags, uint32_t total,
                  uint32_t chunks);
/* The tombstone of sender's message msg from src, if it ended in the last 30 s (TOMB_NS); else NULL. */
struct tombstone *rx_find_tomb(p2p_engine *eng, uint16_t sender, uint32_t msg, const struct sockaddr_in *src,
                               uint64_t now);
/* Records that m ended (flags: DONE_COMPLETE or 0, as its DONE says), over the oldest tombstone. */
void rx_add_tomb(p2p_engine *eng, const struct rx *m, uint32_t flags, uint64_t now);

#endif
