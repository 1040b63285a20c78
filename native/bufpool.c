/* Buffers for received messages that live across rounds.
 *
 * A job's rounds receive messages of about the same sizes again and again. Allocated anew, each
 * large buffer is mapped, faulted in and zeroed by the kernel page by page, then unmapped when
 * Python drops the delivery: at hundreds of MB per round that was a large share of a round's CPU.
 * Here a buffer handed back (its delivery freed, or its message dropped) is kept and given to the
 * next message that fits it (the smallest kept one at least its size: a partitioned round's parts
 * move with each view of the links, by a few percent on shaped links and by several times on
 * loopback, where the rates measured are noisy), so the pages stay mapped; a new one is allocated with
 * room to grow (HEADROOM).
 *
 * What it keeps is bounded twice: by keep_limit (the engine passes its partial-message quota), and
 * so that what it keeps and what is handed out never exceed the most it had handed out at once: a
 * job holds no more than its own peak (its RSS is flat across rounds, not larger). Small buffers (below POOL_MIN) go straight to malloc and free:
 * the allocator's heap already reuses them without faults.
 *
 * Threads: the I/O thread takes, whoever frees a delivery gives back (a Python thread), so the
 * lists are under the pool's mutex. Life: one reference per buffer handed out, plus the engine's;
 * the last one frees the pool, so a delivery may outlive its engine. */
#include <pthread.h>
#include <stdlib.h>

#include "bufpool.h"

#define POOL_MIN (256u << 10)
#define HEADER 64                 /* before each buffer: struct held, padded to keep buffers aligned */
#define HEADROOM 8                /* a new pooled buffer is 1/HEADROOM larger than asked, so that a part
                                     a little larger next round still fits (the pages past what arrives
                                     are never touched: they cost no RSS) */

struct held {
    struct bufpool *pool;         /* NULL: a small buffer, not pooled */
    struct held *next;            /* in the pool's free list */
    uint64_t size;                /* bytes after the header */
};

struct bufpool {
    pthread_mutex_t mu;
    struct held *free;            /* under mu: buffers handed back, newest first; owned */
    uint64_t kept, out, peak;     /* under mu: bytes in free, bytes handed out, most ever handed out at once */
    uint64_t keep_limit;
    int refs;                     /* under mu: the owner's (until bufpool_close) + one per buffer out */
};

static struct held *held_of(uint8_t *buf) {
    return (struct held *)(buf - HEADER);
}

struct bufpool *bufpool_new(uint64_t keep_limit) {
    struct bufpool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pthread_mutex_init(&pool->mu, NULL);
    pool->keep_limit = keep_limit;
    pool->refs = 1;
    return pool;
}

static void pool_free(struct bufpool *pool) {
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

/* With mu held: what the pool may keep (the limit, and its peak less what is handed out). */
static uint64_t room(const struct bufpool *pool) {
    uint64_t below_peak = pool->peak > pool->out ? pool->peak - pool->out : 0;
    return below_peak < pool->keep_limit ? below_peak : pool->keep_limit;
}

/* With mu held: frees the oldest kept buffers until the pool keeps at most `limit` bytes. */
static void trim(struct bufpool *pool, uint64_t limit) {
    while (pool->kept > limit) {
        struct held **pp = &pool->free;
        while ((*pp)->next) pp = &(*pp)->next;
        struct held *oldest = *pp;
        *pp = NULL;
        pool->kept -= oldest->size;
        free(oldest);
    }
}

uint8_t *bufpool_take(struct bufpool *pool, uint64_t size, int *fresh) {
    *fresh = 0;
    if (size > SIZE_MAX - 2 * HEADER) return NULL;
    uint64_t rounded = ((size + HEADER - 1) / HEADER) * HEADER;
    if (size < POOL_MIN) {
        struct held *h = aligned_alloc(HEADER, HEADER + rounded);
        if (!h) return NULL;
        h->pool = NULL;
        h->size = rounded;
        return (uint8_t *)h + HEADER;
    }
    pthread_mutex_lock(&pool->mu);
    struct held **best = NULL;
    for (struct held **pp = &pool->free; *pp; pp = &(*pp)->next)
        if ((*pp)->size >= size && (!best || (*pp)->size < (*best)->size)) best = pp;
    struct held *h = NULL;
    if (best) {
        h = *best;
        *best = h->next;
        pool->kept -= h->size;
    } else {  /* none fits: the kept ones give way first, so that the new one stays within the peak */
        if (rounded <= (SIZE_MAX - 2 * HEADER) / 2) rounded += rounded / HEADROOM / HEADER * HEADER;
        pool->out += rounded;
        trim(pool, room(pool));
        pool->out -= rounded;
    }
    uint64_t taken = h ? h->size : rounded;
    pool->refs++;
    pool->out += taken;
    if (pool->out > pool->peak) pool->peak = pool->out;
    pthread_mutex_unlock(&pool->mu);
    if (!h) {
        if (!(h = aligned_alloc(HEADER, HEADER + rounded))) {
            pthread_mutex_lock(&pool->mu);
            pool->out -= rounded;
            pool->refs--;  /* (never the last: the engine that takes holds the owner's reference) */
            pthread_mutex_unlock(&pool->mu);
            return NULL;
        }
        h->size = rounded;
        h->pool = pool;
        *fresh = 1;
    }
    return (uint8_t *)h + HEADER;
}

void bufpool_give(uint8_t *buf) {
    if (!buf) return;
    struct held *h = held_of(buf);
    struct bufpool *pool = h->pool;
    if (!pool) {
        free(h);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->out -= h->size;
    h->next = pool->free;
    pool->free = h;
    pool->kept += h->size;
    trim(pool, room(pool));
    int last = --pool->refs == 0;
    if (last) trim(pool, 0);
    pthread_mutex_unlock(&pool->mu);
    if (last) pool_free(pool);
}

void bufpool_close(struct bufpool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->keep_limit = 0;         /* what comes back from now on is freed */
    trim(pool, 0);
    int last = --pool->refs == 0;
    pthread_mutex_unlock(&pool->mu);
    if (last) pool_free(pool);
}
