/* The send batch: datagrams of one pass to one destination, each gathered in place from the
 * message's memory (meta, segments, alignment padding: no copy unless a chunk spans more than
 * BATCH_PIECES pieces), given its header and tag, merged into GSO super-datagrams where the path
 * allows, and handed to the kernel in one sendmmsg. Which chunks, and how many pacing and the
 * window allow, is the caller's (tx.c); the scratch (struct batch) is the engine's, I/O thread only.
 * Tuning: BATCH_MAX_DGRAMS bounds one call (and the work between two looks at the sockets). */
#ifndef P2P_BATCH_H
#define P2P_BATCH_H
#include <netinet/in.h>
#include <stdint.h>

#include "send.h"

#define BATCH_MAX_DGRAMS 256      /* datagrams per call (per sendmmsg) */

/* What one batch_send did. */
struct batch_result {
    int dgrams;                   /* datagrams that went out: the first `dgrams` chunks asked for */
    uint64_t bytes;               /* their bytes, headers included (not WIRE_OVERHEAD) */
    int blocked;                  /* the socket took less than was gathered: wait until it is writable */
    int error;                    /* errno of a kernel refusal that retrying cannot help, else 0 */
};

/* Allocates eng->batch (0, or -1 out of memory); freed with batch_free. */
int batch_init(p2p_engine *eng);
void batch_free(p2p_engine *eng);
/* Sends chunks ks[0..n) of s, in transmission pass `pass`, to `to` (to_group: in the stream of the
 * engine's multicast group, auth.h), n <= BATCH_MAX_DGRAMS. Gathers as many as the scratch holds;
 * what did not go out is the caller's to send again. A path that cannot segment (GSO refused)
 * turns GSO off for the engine and sends nothing this time. */
void batch_send(p2p_engine *eng, const struct p2p_send *s, const struct sockaddr_in *to, int to_group, uint16_t pass,
                const uint32_t *ks, int n, struct batch_result *out);

#endif
