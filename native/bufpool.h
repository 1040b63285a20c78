/* Buffers for received messages that live across rounds (bufpool.c). */
#ifndef P2P_BUFPOOL_H
#define P2P_BUFPOOL_H
#include <stdint.h>

struct bufpool;

/* A pool that keeps at most keep_limit bytes of buffers handed back, and never more than the most
 * it had handed out at once; NULL when out of memory. The caller holds one reference (bufpool_close). */
struct bufpool *bufpool_new(uint64_t keep_limit);
/* A buffer of at least size bytes, 64-byte aligned, contents undefined (not zeroed: the caller
 * writes or zeroes what it exposes), or NULL when out of memory. Any thread. *fresh: 1 when a
 * buffer of the pool's sizes was allocated anew (none kept fitted), else 0. */
uint8_t *bufpool_take(struct bufpool *pool, uint64_t size, int *fresh);
/* Hands back a buffer from bufpool_take (NULL: nothing); any thread, also after bufpool_close. */
void bufpool_give(uint8_t *buf);
/* Drops the caller's reference: frees what the pool keeps, and the pool itself with the last
 * buffer handed back. */
void bufpool_close(struct bufpool *pool);

#endif
