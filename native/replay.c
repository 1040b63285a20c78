/* Sliding replay windows per (sender, session) (replay.h). */
#include "replay.h"

#include <stdlib.h>
#include <string.h>

#define PROBES 8  /* candidate slots per pair (open addressing) */

int replay_init(struct replay *r) {
    r->slots = calloc(REPLAY_SESSIONS, sizeof *r->slots);
    return r->slots ? 0 : -1;
}

void replay_free(struct replay *r) {
    free(r->slots);
    r->slots = NULL;
}

/* The pair's entry, or a fresh one in a free slot or in place of the least recently heard candidate. */
static struct replay_entry *find(struct replay *r, uint16_t sender, uint64_t session) {
    uint64_t h = (session ^ ((uint64_t)sender * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    uint32_t first = (uint32_t)(h >> 40) % REPLAY_SESSIONS;
    struct replay_entry *victim = NULL;
    for (uint32_t i = 0; i < PROBES; i++) {
        struct replay_entry *e = &r->slots[(first + i) % REPLAY_SESSIONS];
        if (e->top && e->session == session && e->sender == sender) return e;
        if (!e->top) {
            if (!victim || victim->top) victim = e;
        } else if (!victim || (victim->top && e->heard_ns < victim->heard_ns)) {
            victim = e;
        }
    }
    memset(victim, 0, sizeof *victim);
    victim->session = session;
    victim->sender = sender;
    return victim;
}

/* Clears the window's bits for counters [from, to). */
static void forget(uint64_t *seen, uint64_t from, uint64_t to) {
    if (to - from >= REPLAY_WINDOW) {
        memset(seen, 0, REPLAY_WINDOW / 8);
        return;
    }
    for (uint64_t c = from; c < to; c++) {
        uint32_t bit = (uint32_t)(c % REPLAY_WINDOW);
        if (!(bit & 63) && to - c >= 64) { /* a whole word at once */
            seen[bit / 64] = 0;
            c += 63;
        } else {
            seen[bit / 64] &= ~(1ull << (bit & 63));
        }
    }
}

int replay_accept(struct replay *r, uint16_t sender, uint64_t session, uint32_t counter, uint64_t now) {
    struct replay_entry *e = find(r, sender, session);
    uint64_t c = counter;
    if (c >= e->top) {
        forget(e->seen, e->top, c + 1);
        e->top = c + 1;
    } else if (e->top - c > REPLAY_WINDOW) {
        return 0;
    }
    uint64_t *word = &e->seen[(c % REPLAY_WINDOW) / 64], bit = 1ull << (c % 64);
    if (*word & bit) return 0;
    *word |= bit;
    e->heard_ns = now;
    return 1;
}
