/* The I/O thread's units and what they share: io.c runs the loop, datagram.c reads and checks
 * what the sockets received and sends control datagrams, tx.c sends this peer's messages (with
 * txr.c, group.c, batch.c and pacer.c: tx.h), rx.c reassembles the messages it receives.
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
void rx_free_all(p2p_engine *eng);

#endif
