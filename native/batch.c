/* The send batch (batch.h). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "batch.h"
#include "engine.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

#define MAX_MSGS 64               /* sendmmsg messages (plain or GSO super-datagrams) per batch */
#define MAX_GSO_SEGS 64           /* datagrams per GSO super-datagram ... */
#define MAX_GSO_BYTES 65000       /* ... and its bytes (the kernel's limit is one IP packet) */
#define PIECES 6                  /* iovecs per datagram before gathering into a staging copy */
_Static_assert(PIECES <= AUTH_MAX_BODY, "a tag covers every piece of a datagram");
#define STAGE_SLOTS 64            /* staging copies per batch, 64 KiB each in eng->sbuf */

static const uint8_t zeros[8];

struct batch {
    struct mmsghdr mm[MAX_MSGS];
    struct iovec iov[BATCH_MAX_DGRAMS * (PIECES + 1)];
    uint8_t hdr[BATCH_MAX_DGRAMS][WIRE_HDR];
    char cmsg[MAX_MSGS][CMSG_SPACE(sizeof(uint16_t))];
    int msg_dgrams[MAX_MSGS];
    uint16_t msg_size[MAX_MSGS];  /* GSO segment size: every datagram of the message has it */
};

int batch_init(p2p_engine *eng) {
    eng->batch = calloc(1, sizeof(struct batch));
    return eng->batch ? 0 : -1;
}

void batch_free(p2p_engine *eng) {
    free(eng->batch);
    eng->batch = NULL;
}

/* The pieces of chunk k in place: meta, segment memory and alignment padding. With `copy_to` set,
 * copies them there instead. Returns the piece count, or -1 when more than `max` are needed. */
static int gather(const struct p2p_send *s, uint32_t k, struct iovec *iov, int max, uint8_t *copy_to) {
    uint64_t pos = (uint64_t)k * s->chunk, end = pos + chunk_len(s, k);
    int n = 0;
#define PIECE(p, l)                                                                    \
    do {                                                                               \
        if (copy_to) { memcpy(copy_to, (p), (l)); copy_to += (l); }                    \
        else { if (n == max) return -1; iov[n].iov_base = (void *)(p); iov[n].iov_len = (l); } \
        n++;                                                                           \
    } while (0)
    if (pos < s->meta_len) {
        uint64_t hi = end < s->meta_len ? end : s->meta_len;
        PIECE(s->meta + pos, hi - pos);
        pos = hi;
    }
    for (uint32_t i = s->chunk_seg[k]; i < s->nseg && pos < end; i++) {
        if (s->seg_flat[i] > pos) {
            PIECE(zeros, s->seg_flat[i] - pos);
            pos = s->seg_flat[i];
        }
        uint64_t segend = s->seg_flat[i] + s->seg_len[i];
        uint64_t hi = end < segend ? end : segend;
        if (hi > pos) {
            PIECE(s->seg_ptr[i] + (pos - s->seg_flat[i]), hi - pos);
            pos = hi;
        }
    }
#undef PIECE
    return n;
}

/* Gathers and seals chunks ks[0..n) into the scratch's messages, GSO-merging equal-size datagrams
 * (all to one address) into one super-datagram the kernel splits. Returns how many it took (all of
 * them unless the messages or staging copies ran out); *nm: the messages it filled. */
static int pack(p2p_engine *eng, const struct p2p_send *s, const struct sockaddr_in *to, int to_group, uint16_t pass,
                const uint32_t *ks, int n, int *nm_out) {
    struct batch *B = eng->batch;
    int nd = 0, nm = 0, niov = 0, staged = 0;
    uint32_t gso_size = 0, gso_bytes = 0;
    struct auth_dest dest = {to->sin_addr.s_addr, ntohs(to->sin_port)};
    for (; nd < n; nd++) {
        uint32_t k = ks[nd], len = chunk_len(s, k), size = WIRE_HDR + len;
        int join = eng->gso && nm > 0 && gso_size == size && B->msg_dgrams[nm - 1] < MAX_GSO_SEGS &&
                   gso_bytes + size <= MAX_GSO_BYTES;
        if (!join && nm == MAX_MSGS) break;
        struct iovec *iv = &B->iov[niov];
        int np = gather(s, k, iv + 1, PIECES, NULL);
        if (np < 0) {
            if (staged == STAGE_SLOTS) break;
            uint8_t *stage = eng->sbuf + (size_t)staged++ * 65536;
            gather(s, k, NULL, 0, stage);
            iv[1].iov_base = stage;
            iv[1].iov_len = len;
            np = 1;
        }
        struct wire_hdr h;
        send_hdr(s, T_DATA, &h);
        h.sender = eng->cfg.sender_id;
        h.pass = pass;
        h.chunk = k;
        wire_put_hdr(B->hdr[nd], &h);
        auth_seal(&eng->auth, to_group ? &eng->group_stream : &eng->auth.stream, &dest, B->hdr[nd], iv + 1, np);
        iv[0].iov_base = B->hdr[nd];
        iv[0].iov_len = WIRE_HDR;
        if (join) {
            struct msghdr *mh = &B->mm[nm - 1].msg_hdr;
            mh->msg_iovlen += (size_t)np + 1;
            B->msg_dgrams[nm - 1]++;
            gso_bytes += size;
        } else {
            struct msghdr *mh = &B->mm[nm].msg_hdr;
            memset(mh, 0, sizeof *mh);
            mh->msg_name = (void *)to;
            mh->msg_namelen = sizeof *to;
            mh->msg_iov = iv;
            mh->msg_iovlen = (size_t)np + 1;
            B->msg_size[nm] = (uint16_t)size;
            B->msg_dgrams[nm++] = 1;
            gso_size = size;
            gso_bytes = size;
        }
        niov += np + 1;
    }
    /* A super-datagram tells the kernel its segment size. */
    for (int m = 0; m < nm; m++) {
        struct msghdr *mh = &B->mm[m].msg_hdr;
        if (B->msg_dgrams[m] < 2) continue;
        mh->msg_control = B->cmsg[m];
        mh->msg_controllen = sizeof B->cmsg[m];
        struct cmsghdr *cm = CMSG_FIRSTHDR(mh);
        cm->cmsg_level = SOL_UDP;
        cm->cmsg_type = UDP_SEGMENT;
        cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        memcpy(CMSG_DATA(cm), &B->msg_size[m], sizeof(uint16_t));
    }
    *nm_out = nm;
    return nd;
}

void batch_send(p2p_engine *eng, const struct p2p_send *s, const struct sockaddr_in *to, int to_group, uint16_t pass,
                const uint32_t *ks, int n, struct batch_result *out) {
    struct batch *B = eng->batch;
    int nm = 0;
    memset(out, 0, sizeof *out);
    if (!pack(eng, s, to, to_group, pass, ks, n, &nm)) return;
    int sent = sendmmsg(eng->fd, B->mm, (unsigned)nm, MSG_DONTWAIT);
    if (sent < 0 && eng->gso && (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT || errno == EOPNOTSUPP)) {
        eng->gso = 0; /* the path cannot segment: fall back to one datagram per message */
        return;
    }
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS && errno != EINTR) {
        out->error = errno;
        return;
    }
    for (int m = 0; m < (sent > 0 ? sent : 0); m++) {
        out->dgrams += B->msg_dgrams[m];
        for (size_t j = 0; j < B->mm[m].msg_hdr.msg_iovlen; j++) out->bytes += B->mm[m].msg_hdr.msg_iov[j].iov_len;
    }
    out->blocked = sent < nm;
}
