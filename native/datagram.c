/* Datagrams between the socket and the engine: reading what arrived in batches, checking each
 * (header, job, tag over its destination, replay) before rx.c or tx.c sees it, and sending control
 * datagrams. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/udp.h>
#include <string.h>
#include <sys/socket.h>

#include "io.h"

#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define RECV_SLOTS 32

void dgram_send_ctl(p2p_engine *eng, const struct sockaddr_in *to, struct wire_hdr *h, const uint8_t *body,
                    size_t blen) {
    uint8_t buf[WIRE_ACK_MAX];
    h->sender = eng->cfg.sender_id;
    wire_put_hdr(buf, h);
    if (blen) memcpy(buf + WIRE_HDR, body, blen);
    struct iovec b = {buf + WIRE_HDR, blen};
    int to_group = IN_MULTICAST(ntohl(to->sin_addr.s_addr)); /* in the group's stream, as its data */
    struct auth_dest dest = {to->sin_addr.s_addr, ntohs(to->sin_port)};
    auth_seal(&eng->auth, to_group ? &eng->group_stream : &eng->auth.stream, &dest, buf, &b, 1);
    /* Best effort: every control datagram is re-sent by the protocol if it is lost. */
    if (sendto(eng->fd, buf, WIRE_HDR + blen, MSG_DONTWAIT, (const struct sockaddr *)to, sizeof *to) > 0) {
        CNT(eng, datagrams_sent, 1);
        CNT(eng, bytes_sent, WIRE_HDR + blen);
    }
}

/* One datagram from src, sent to `at` (auth.h). */
static void on_datagram(p2p_engine *eng, const struct sockaddr_in *src, const struct auth_dest *at, const uint8_t *buf,
                        size_t len, int via_group, uint64_t now) {
    struct wire_hdr h;
    CNT(eng, datagrams_received, 1);
    CNT(eng, bytes_received, len);
    switch (wire_get_hdr(buf, len, &h)) {
    case 0: break;
    case -1: CNT(eng, drop_bad_length, 1); return;
    case -2: CNT(eng, drop_bad_magic, 1); return;
    case -3: CNT(eng, drop_bad_version, 1); return;
    default: CNT(eng, drop_bad_type, 1); return;
    }
    if (h.job != eng->auth.job) { CNT(eng, drop_other_job, 1); return; }
    if (!auth_check(&eng->auth, at, buf, len)) { CNT(eng, drop_bad_tag, 1); return; }
    if (via_group && h.type != T_DATA && h.type != T_PROBE) { CNT(eng, drop_bad_type, 1); return; }
    /* Per receiver, so one datagram reaching many members through a group passes at each. */
    if (!replay_accept(&eng->replay, h.sender, h.session, h.counter, now)) { CNT(eng, drop_replayed, 1); return; }
    if (via_group) CNT(eng, mcast_datagrams_received, 1);
    const uint8_t *body = buf + WIRE_HDR;
    size_t blen = len - WIRE_HDR;
    if (h.type == T_DATA) rx_on_data(eng, &h, src, body, blen, via_group, now);
    else if (h.type == T_PROBE || h.type == T_CLOSE) rx_on_probe_or_close(eng, &h, src, body, blen, via_group, now);
    else if (h.type == T_JOIN) rx_on_join(eng, &h, src, body, blen, now);
    else tx_on_reply(eng, &h, src, body, blen, now);
}

/* Reads what the socket holds, in batches, splitting GRO-coalesced buffers into datagrams. */
void dgram_drain(p2p_engine *eng, int fd, int via_group) {
    struct mmsghdr mm[RECV_SLOTS];
    struct iovec iov[RECV_SLOTS];
    struct sockaddr_in from[RECV_SLOTS];
    char ctl[RECV_SLOTS][CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(struct in_pktinfo))];
    /* Without IP_PKTINFO (it cannot be missing on Linux) the socket's own address stands for the destination. */
    struct auth_dest bound = {via_group ? INADDR_ANY : eng->local.sin_addr.s_addr,
                              via_group ? eng->mc.port : ntohs(eng->local.sin_port)};
    for (int round = 0; round < 16; round++) {
        for (int i = 0; i < RECV_SLOTS; i++) {
            iov[i].iov_base = eng->rbuf + (size_t)i * 65536;
            iov[i].iov_len = 65536;
            memset(&mm[i].msg_hdr, 0, sizeof mm[i].msg_hdr);
            mm[i].msg_hdr.msg_name = &from[i];
            mm[i].msg_hdr.msg_namelen = sizeof from[i];
            mm[i].msg_hdr.msg_iov = &iov[i];
            mm[i].msg_hdr.msg_iovlen = 1;
            mm[i].msg_hdr.msg_control = ctl[i];
            mm[i].msg_hdr.msg_controllen = sizeof ctl[i];
        }
        int n = recvmmsg(fd, mm, RECV_SLOTS, MSG_DONTWAIT, NULL);
        if (n <= 0) return;
        uint64_t now = now_ns();
        for (int i = 0; i < n; i++) {
            size_t len = mm[i].msg_len, seg = len;
            struct auth_dest at = bound;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&mm[i].msg_hdr); c; c = CMSG_NXTHDR(&mm[i].msg_hdr, c))
                if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                    int g;
                    memcpy(&g, CMSG_DATA(c), sizeof g);
                    if (g > 0) seg = (size_t)g;
                } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
                    struct in_pktinfo pi;
                    memcpy(&pi, CMSG_DATA(c), sizeof pi);
                    at.addr = pi.ipi_addr.s_addr; /* the IP header's destination */
                }
            const uint8_t *p = iov[i].iov_base;
            size_t off = 0;
            do { /* an empty datagram is still one to count and drop */
                on_datagram(eng, &from[i], &at, p + off, len - off < seg ? len - off : seg, via_group, now);
                off += seg;
            } while (off < len);
        }
        if (n < RECV_SLOTS) return;
    }
}
