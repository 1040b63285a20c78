/* The p2pcast wire format (internal). Every field is little-endian.
 *
 * Header, 56 bytes, in front of every datagram:
 *   0  u16 magic 0x7032 ('p2')     2  u8 version        3  u8 type
 *   4  u16 sender id               6  u16 pass (DATA: transmission pass; else 0)
 *   8  u32 message id             12  u32 chunk index (DATA), else 0
 *  16  u32 chunk count            20  u16 chunk size / 8  22  u16 meta length / 8
 *  24  u64 session: drawn at random by the sending engine, renewed when its counter wraps; one for
 *      its unicast datagrams, another for those to its multicast group (auth.h: struct auth_stream)
 *  32  u32 counter: the session's datagram number (every datagram of the stream, to anyone)
 *  36  u32 job: the first 4 bytes of SHA-256 of the job id (p2plearn.keys.job_tag)
 *  40  16-byte tag: AES-256-GMAC under the job's data key, IV = session || counter, over the
 *      destination (auth.h: where the sender addressed the datagram, not sent), bytes 0-39 and the
 *      body (auth.c); zero with an all-zero key (no authentication, but jobs stay apart).
 * (session, counter) never repeats under a key, so each tag's IV is unique and a receiver can refuse
 * a datagram it already had (replay.c); the destination under the tag makes a datagram good at the
 * one receiver (or group) it was sent to, and the data key (derived from the job id) in one job.
 * A message's meta (its first bytes, always delivered exactly): struct wire_meta and its segment
 * table, coded below. Knowing what must arrive lets a receiver close by itself.
 * Bodies: DATA = the chunk's payload; ACK = struct ack_body + bitmap; PROBE = u16 pass + pad;
 * CLOSE = empty; DONE = struct done_body; JOIN = struct join_body (unicast, header geometry as in
 * PROBE: "message msg comes through this group: join it"), answered by an ACK without bitmap
 * flagged ACK_JOINED or ACK_UNICAST (cannot join: send it by unicast).
 */
#ifndef P2P_WIRE_H
#define P2P_WIRE_H
#include <stddef.h>
#include <stdint.h>

#define WIRE_MAGIC 0x7032
#define WIRE_VERSION 3  /* 3: tags cover the destination; per-job keys and job hash */
#define WIRE_HDR 56
#define WIRE_TAG_AT 40
#define WIRE_TAG 16
#define WIRE_MAX_DATAGRAM 65507u
/* ACKs stay below a 1500-byte MTU whatever the data path allows. */
#define WIRE_ACK_MAX 1472u
#define WIRE_MIN_CHUNK 64u   /* smallest chunk a sender cuts and a receiver accepts (but a message's last) */

enum wire_type { T_DATA = 1, T_ACK = 2, T_PROBE = 3, T_CLOSE = 4, T_DONE = 5, T_JOIN = 6 };

struct wire_hdr {
    uint8_t type;
    uint16_t sender, pass;
    uint32_t msg, chunk, nchunks, chunk_size, meta_len;
    uint64_t session;             /* parsed only: auth_seal writes these three */
    uint32_t counter, job;
};

#define ACK_FINAL 1u     /* last slice of a probe answer */
#define ACK_JOINED 2u    /* answer to a JOIN: the receiver is in the group */
#define ACK_UNICAST 4u   /* answer to a JOIN: it could not join */
struct ack_body {        /* 24 bytes, then ceil(nbits/8) bitmap bytes */
    uint16_t pass, flags;
    uint32_t pass_high;  /* highest chunk index received in this pass + 1 (0 = none) */
    uint32_t pass_count; /* datagrams received in this pass */
    uint32_t total;      /* datagrams received for the message in all passes */
    uint32_t start, nbits;
};
#define ACK_BODY 24

#define DONE_COMPLETE 1u
struct done_body { uint32_t flags, total, chunks; };
#define DONE_BODY 12
struct join_body { uint32_t group; uint16_t port; }; /* group in network order, then u16 port, u16 0 */
#define JOIN_BODY 8
#define PROBE_BODY 4     /* u16 pass, u16 0 */

/* Writes the fields before the session; session, counter, job and tag are left zero for auth_seal. */
void wire_put_hdr(uint8_t *out, const struct wire_hdr *h);
/* Parses and checks magic/version/type; returns 0 or a negative reason (see engine counters). */
int wire_get_hdr(const uint8_t *in, size_t len, struct wire_hdr *h);

/* A message's meta, at the start of its flat bytes: 24 bytes (u32 meta length, u32 segment count,
 * u64 data length, u32 app length, u32 0), then META_ENTRY bytes per segment (u64 offset in the
 * data region, u64 length, u64 bytes that must arrive), then the app blob, zero up to meta length.
 * The data region (the segments, each 8-byte aligned) follows the meta. */
#define META_FIXED 24
#define META_ENTRY 24
#define WIRE_META_MAX (0xFFFFu * 8)   /* the header carries meta length / 8 in a u16 */

struct wire_meta {
    uint32_t meta_len;            /* bytes, a multiple of 8: the header's meta length */
    uint32_t nseg;
    uint64_t data_len;            /* bytes after the meta: the segments and the padding that aligns them */
    uint32_t app_len;
    const uint8_t *app;           /* the application's blob: wire_put_meta copies it in, wire_get_meta
                                   * points it into the meta it decoded (no copy, lives as long) */
};
struct wire_segment {
    uint64_t off, len;            /* in the data region (after the meta) */
    uint64_t need;                /* bytes of it that must arrive (its loss bound) */
};

/* The meta length for nseg segments and an app blob of app_len bytes, or 0 when the header cannot
 * carry that much (over WIRE_META_MAX). */
uint32_t wire_meta_len(uint32_t nseg, uint32_t app_len);
/* Writes m's fixed part and app blob over the m->meta_len bytes at out, the rest zero; each segment
 * then goes in with wire_put_meta_segment. m->meta_len must be wire_meta_len(m->nseg, m->app_len). */
void wire_put_meta(uint8_t *out, const struct wire_meta *m);
void wire_put_meta_segment(uint8_t *out, uint32_t i, const struct wire_segment *seg);
/* Decodes and checks the meta_len bytes at p (meta_len from the header) against the message's
 * geometry: cap = chunk count * chunk size, total = its length if known (from its last chunk), else
 * 0. Returns 0 and fills *m, or -1 when anything is malformed: a meta shorter than its fixed part or
 * than its table and blob, longer than the message, or not a multiple of 8; segments out of order, overlapping, outside
 * the data, not 8-byte aligned, needing more than they hold; a length the chunks disagree with. */
int wire_get_meta(const uint8_t *p, uint32_t meta_len, uint64_t cap, uint32_t chunk, uint64_t total,
                  struct wire_meta *m);
/* Segment i of the meta at p that wire_get_meta accepted as *m; -1 when i is not below its count. */
int wire_get_meta_segment(const uint8_t *p, const struct wire_meta *m, uint32_t i, struct wire_segment *seg);

void wire_put_ack(uint8_t *out, const struct ack_body *a);
void wire_get_ack(const uint8_t *in, struct ack_body *a);
void wire_put_done(uint8_t *out, const struct done_body *d);
void wire_get_done(const uint8_t *in, struct done_body *d);
void wire_put_probe(uint8_t *out, uint16_t pass);
uint16_t wire_get_probe(const uint8_t *in);
void wire_put_join(uint8_t *out, const struct join_body *j);
void wire_get_join(const uint8_t *in, struct join_body *j);

static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24); }
static inline uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }

#endif
