/* The I/O thread: one epoll loop over the engine's UDP socket. It reads datagrams and hands them to
 * rx.c (data, probes, closes) or tx.c (ACKs, DONEs), lets tx.c send what pacing allows, and runs
 * both sides' timers. Python never runs here. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/udp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "io.h"

#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define RECV_SLOTS 32
#define SWEEP_NS 20000000ull

void io_send_ctl(p2p_engine *eng, const struct sockaddr_in *to, struct wire_hdr *h, const uint8_t *body,
                 size_t blen) {
    uint8_t buf[WIRE_ACK_MAX];
    h->sender = eng->cfg.sender_id;
    wire_put_hdr(buf, h);
    if (blen) memcpy(buf + WIRE_HDR, body, blen);
    struct iovec b = {buf + WIRE_HDR, blen};
    wire_sign(&eng->key, buf, &b, 1);
    /* Best effort: every control datagram is re-sent by the protocol if it is lost. */
    if (sendto(eng->fd, buf, WIRE_HDR + blen, MSG_DONTWAIT, (const struct sockaddr *)to, sizeof *to) > 0) {
        CNT(eng, datagrams_sent, 1);
        CNT(eng, bytes_sent, WIRE_HDR + blen);
    }
}

static void on_datagram(p2p_engine *eng, const struct sockaddr_in *src, const uint8_t *buf, size_t len, uint64_t now) {
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
    if (!wire_verify(&eng->key, buf, len)) { CNT(eng, drop_bad_tag, 1); return; }
    const uint8_t *body = buf + WIRE_HDR;
    size_t blen = len - WIRE_HDR;
    if (h.type == T_DATA) rx_on_data(eng, &h, src, body, blen, now);
    else if (h.type == T_PROBE || h.type == T_CLOSE) rx_on_probe_or_close(eng, &h, src, body, blen, now);
    else tx_on_reply(eng, &h, src, body, blen, now);
}

/* Reads what the socket holds, in batches, splitting GRO-coalesced buffers into datagrams. */
static void drain(p2p_engine *eng) {
    struct mmsghdr mm[RECV_SLOTS];
    struct iovec iov[RECV_SLOTS];
    struct sockaddr_in from[RECV_SLOTS];
    char ctl[RECV_SLOTS][CMSG_SPACE(sizeof(int))];
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
        int n = recvmmsg(eng->fd, mm, RECV_SLOTS, MSG_DONTWAIT, NULL);
        if (n <= 0) return;
        uint64_t now = now_ns();
        for (int i = 0; i < n; i++) {
            size_t len = mm[i].msg_len, seg = len;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&mm[i].msg_hdr); c; c = CMSG_NXTHDR(&mm[i].msg_hdr, c))
                if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                    int g;
                    memcpy(&g, CMSG_DATA(c), sizeof g);
                    if (g > 0) seg = (size_t)g;
                }
            const uint8_t *p = iov[i].iov_base;
            size_t off = 0;
            do { /* an empty datagram is still one to count and drop */
                on_datagram(eng, &from[i], p + off, len - off < seg ? len - off : seg, now);
                off += seg;
            } while (off < len);
        }
        if (n < RECV_SLOTS) return;
    }
}

static void set_want_out(p2p_engine *eng, int on) {
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.fd = eng->fd};
    epoll_ctl(eng->epfd, EPOLL_CTL_MOD, eng->fd, &ev);
}

/* Waits for socket or wake-up events, at most wait_ns; returns how many (0 also when interrupted). */
static int wait_events(p2p_engine *eng, struct epoll_event *evs, int max, uint64_t wait_ns) {
    int n;
    if (!eng->no_pwait2) {
        struct timespec ts = {(time_t)(wait_ns / 1000000000ull), (long)(wait_ns % 1000000000ull)};
        n = epoll_pwait2(eng->epfd, evs, max, &ts, NULL);
        if (n < 0 && errno == ENOSYS) eng->no_pwait2 = 1; /* Linux before 5.11: millisecond timeouts */
    }
    if (eng->no_pwait2) {
        uint64_t ms = (wait_ns + 999999) / 1000000;
        n = epoll_wait(eng->epfd, evs, max, ms > 1000 ? 1000 : (int)ms);
    }
    return n < 0 ? 0 : n; /* EINTR; nothing else can fail on a valid epoll fd */
}

void *io_main(void *arg) {
    p2p_engine *eng = arg;
    int out_armed = 0;
    for (;;) {
        pthread_mutex_lock(&eng->mu);
        int closing = eng->closing;
        pthread_mutex_unlock(&eng->mu);
        if (closing) break;
        uint64_t now = now_ns();
        tx_take_commands(eng, now);
        drain(eng);
        now = now_ns();
        tx_timers(eng, now);
        if (now - eng->last_sweep_ns > ACK_DELAY_NS) {
            rx_timers(eng, now);
            eng->last_sweep_ns = now;
        }
        int more = eng->want_out ? 0 : tx_pump(eng, now);
        tx_reap(eng);

        uint64_t wake = rx_next_wake(eng, tx_next_wake(eng, now, now + SWEEP_NS));
        if (eng->want_out != out_armed) {
            set_want_out(eng, eng->want_out);
            out_armed = eng->want_out;
        }
        struct epoll_event evs[4];
        int n = wait_events(eng, evs, 4, more || wake <= now ? 0 : wake - now);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.fd == eng->evfd) {
                uint64_t v;
                ssize_t rd = read(eng->evfd, &v, sizeof v);
                (void)rd;
            } else if (evs[i].events & EPOLLOUT) {
                eng->want_out = 0;
            }
        }
    }
    return NULL;
}

/* After the I/O thread stopped: end every send, free every partial message and undelivered delivery. */
void io_finish_all(p2p_engine *eng) {
    tx_cancel_all(eng, now_ns());
    rx_free_all(eng);
    pthread_mutex_lock(&eng->mu);
    struct delivery_priv *d = eng->dq_head;
    eng->dq_head = eng->dq_tail = NULL;
    pthread_mutex_unlock(&eng->mu);
    while (d) {
        struct delivery_priv *next = d->next;
        p2p_delivery_free(&d->pub);
        d = next;
    }
}

int io_init(p2p_engine *eng) {
    return tx_init(eng);
}
