/* Replay refusal: which datagrams of each (sender, session) already arrived. Per pair, a sliding
 * window over the last REPLAY_WINDOW counters behind the highest seen; a datagram whose counter is
 * marked there, or older than the window, is refused. Memory is fixed: REPLAY_SESSIONS pairs, the
 * least recently heard of a few candidate slots reused for a new one. Only authentic datagrams
 * reach it, so an outsider cannot evict anyone.
 * The window is per receiver: a datagram that reaches many members of a group passes at each once.
 * Tuning: a sender's counter advances with every datagram it sends to anyone, so the window must
 * cover what a receiver's datagrams can be reordered by: 2048 datagrams is 24 ms at 1 Gbit/s with
 * 1500-byte frames. I/O thread only. */
#ifndef P2P_REPLAY_H
#define P2P_REPLAY_H
#include <stdint.h>

#define REPLAY_WINDOW 2048u
#define REPLAY_SESSIONS 1024u

struct replay_entry {
    uint64_t session;
    uint64_t top;                 /* highest counter seen + 1; 0 = free slot */
    uint64_t heard_ns;
    uint16_t sender;
    uint64_t seen[REPLAY_WINDOW / 64]; /* bit (counter % REPLAY_WINDOW) for counters in [top - WINDOW, top) */
};

struct replay {
    struct replay_entry *slots;   /* owned, REPLAY_SESSIONS of them */
};

int replay_init(struct replay *r);
void replay_free(struct replay *r);
/* 1: first arrival, now recorded; 0: already seen, or older than the window. */
int replay_accept(struct replay *r, uint16_t sender, uint64_t session, uint32_t counter, uint64_t now);

#endif
