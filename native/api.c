/* The public API of the engine: its lifetime, address, counters and path chunk size, and the
 * helpers the other units share (engine.h). Sends: send.c; deliveries: delivery.c. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "batch.h"
#include "engine.h"

#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define MAX_CHUNK P2P_MAX_CHUNK
_Static_assert(P2P_MAX_CHUNK == ((WIRE_MAX_DATAGRAM - WIRE_HDR) & ~7u), "the largest multiple of 8 a datagram fits");

uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int parse_ipv4(const char *host, uint16_t port, struct sockaddr_in *out) {
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons(port);
    if (!host || inet_pton(AF_INET, host, &out->sin_addr) != 1)
        return set_error(EINVAL, "not an IPv4 address: '%s'", host ? host : "(null)");
    return 0;
}

void p2p_config_default(p2p_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->gso = 1;
}

static void set_buffers(int fd, int bytes) {
    /* FORCE variants pass rmem_max/wmem_max when root; otherwise the kernel caps the plain ones. */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

int p2p_engine_open(const p2p_config *cfg_in, p2p_engine **out) {
    p2p_config cfg = *cfg_in;
    if (cfg.drop_prob < 0 || cfg.drop_prob >= 1 || isnan(cfg.drop_prob))
        return set_error(EINVAL, "drop_prob must be in [0, 1), got %g", cfg.drop_prob);
    if (cfg.uplink_rate < 0 || isnan(cfg.uplink_rate))
        return set_error(EINVAL, "uplink_rate must be >= 0, got %g", cfg.uplink_rate);
    if (cfg.max_datagram && (cfg.max_datagram < WIRE_HDR + WIRE_MIN_CHUNK || cfg.max_datagram > WIRE_MAX_DATAGRAM))
        return set_error(EINVAL, "max_datagram must be in [%u, %u], got %u", WIRE_HDR + WIRE_MIN_CHUNK,
                         WIRE_MAX_DATAGRAM, cfg.max_datagram);
    if (!cfg.window_bytes) cfg.window_bytes = 8u << 20;
    if (!cfg.rx_idle_ms) cfg.rx_idle_ms = 5000;
    if (!cfg.max_message_bytes) cfg.max_message_bytes = 4ull << 30;
    if (!cfg.max_partial_messages) cfg.max_partial_messages = 1024;
    if (!cfg.max_partial_per_source) cfg.max_partial_per_source = 64;
    if (!cfg.max_partial_bytes) cfg.max_partial_bytes = 16ull << 30;
    if (cfg.max_partial_per_source > cfg.max_partial_messages) cfg.max_partial_per_source = cfg.max_partial_messages;
    if (!cfg.max_queued_messages) cfg.max_queued_messages = cfg.max_partial_messages;
    if (!cfg.max_queued_bytes) cfg.max_queued_bytes = cfg.max_partial_bytes;
    if (!cfg.socket_buffer) cfg.socket_buffer = 32u << 20;

    p2p_engine *eng = calloc(1, sizeof *eng);
    if (!eng) return set_error(ENOMEM, "out of memory");
    eng->cfg = cfg;
    eng->cfg.host = NULL; /* the caller's string is not kept */
    eng->fd = eng->evfd = eng->epfd = eng->mc.fd = -1;
    eng->refs = 1;
    eng->uplink.rate = cfg.uplink_rate;
    eng->rng = cfg.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    int rc = parse_ipv4(cfg.host, cfg.port, &eng->local);
    if (rc) goto fail;
    if ((rc = auth_init(&eng->auth, cfg.key, cfg.job_id)) || (rc = auth_stream_init(&eng->auth, &eng->group_stream)))
        goto fail;
    if (replay_init(&eng->replay)) { rc = set_error(ENOMEM, "out of memory"); goto fail; }

    eng->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (eng->fd < 0) { rc = set_error(errno, "socket: %s", strerror(errno)); goto fail; }
    if (bind(eng->fd, (struct sockaddr *)&eng->local, sizeof eng->local) < 0) {
        rc = set_error(errno, "bind %s:%u: %s", cfg.host, cfg.port, strerror(errno));
        goto fail;
    }
    socklen_t sl = sizeof eng->local;
    getsockname(eng->fd, (struct sockaddr *)&eng->local, &sl);
    set_buffers(eng->fd, (int)cfg.socket_buffer);
    int one = 1;
    eng->gso = cfg.gso;
    eng->gro = cfg.gso && setsockopt(eng->fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
    /* Each datagram's destination address, which its tag covers (auth.h). */
    if (setsockopt(eng->fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) < 0) {
        rc = set_error(errno, "IP_PKTINFO: %s", strerror(errno));
        goto fail;
    }
    if ((rc = mcast_open(&eng->mc, &cfg, eng->fd, eng->local.sin_addr))) goto fail;
    if (eng->mc.fd >= 0) {
        set_buffers(eng->mc.fd, (int)cfg.socket_buffer);
        if (eng->gro) setsockopt(eng->mc.fd, SOL_UDP, UDP_GRO, &one, sizeof one);
        if (setsockopt(eng->mc.fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) < 0) {
            rc = set_error(errno, "IP_PKTINFO: %s", strerror(errno));
            goto fail;
        }
    }

    eng->rbuf = malloc((size_t)32 * 65536);
    eng->sbuf = malloc((size_t)64 * 65536);
    eng->rxpool = bufpool_new(cfg.max_partial_bytes);
    if (!eng->rbuf || !eng->sbuf || !eng->rxpool || io_init(eng)) { rc = set_error(ENOMEM, "out of memory"); goto fail; }
    eng->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    eng->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (eng->evfd < 0 || eng->epfd < 0) { rc = set_error(errno, "eventfd/epoll: %s", strerror(errno)); goto fail; }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = eng->fd};
    epoll_ctl(eng->epfd, EPOLL_CTL_ADD, eng->fd, &ev);
    ev.data.fd = eng->evfd;
    epoll_ctl(eng->epfd, EPOLL_CTL_ADD, eng->evfd, &ev);
    if (eng->mc.fd >= 0) {
        ev.data.fd = eng->mc.fd;
        epoll_ctl(eng->epfd, EPOLL_CTL_ADD, eng->mc.fd, &ev);
    }

    pthread_mutex_init(&eng->mu, NULL);
    pthread_condattr_t monotonic; /* waits are timed on the monotonic clock: setting the date moves no timeout */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&eng->cv, &monotonic);
    pthread_condattr_destroy(&monotonic);
    if ((rc = pthread_create(&eng->thread, NULL, io_main, eng)) != 0) {
        rc = set_error(rc, "pthread_create: %s", strerror(rc));
        pthread_mutex_destroy(&eng->mu);
        pthread_cond_destroy(&eng->cv);
        goto fail;
    }
    *out = eng;
    return 0;
fail:
    mcast_close(&eng->mc);
    if (eng->fd >= 0) close(eng->fd);
    if (eng->evfd >= 0) close(eng->evfd);
    if (eng->epfd >= 0) close(eng->epfd);
    free(eng->rbuf);
    free(eng->sbuf);
    bufpool_close(eng->rxpool);
    batch_free(eng);
    auth_free(&eng->auth);
    replay_free(&eng->replay);
    free(eng);
    return rc;
}

void engine_wake(p2p_engine *eng) {
    uint64_t one = 1;
    ssize_t n = write(eng->evfd, &one, sizeof one);
    (void)n; /* EAGAIN means a wake-up is already pending */
}

void engine_unref(p2p_engine *eng) {
    pthread_mutex_lock(&eng->mu);
    int last = --eng->refs == 0;
    pthread_mutex_unlock(&eng->mu);
    if (!last) return;
    close(eng->evfd); /* only now: a holder may still engine_wake() the I/O thread that close() stopped */
    pthread_mutex_destroy(&eng->mu);
    pthread_cond_destroy(&eng->cv);
    free(eng);
}

void p2p_engine_hold(p2p_engine *eng) {
    pthread_mutex_lock(&eng->mu);
    eng->refs++;
    pthread_mutex_unlock(&eng->mu);
}

void p2p_engine_release(p2p_engine *eng) {
    engine_unref(eng);
}

void p2p_engine_close(p2p_engine *eng) {
    if (!eng) return;
    pthread_mutex_lock(&eng->mu);
    eng->closing = 1;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
    engine_wake(eng);
    pthread_join(eng->thread, NULL);
    io_finish_all(eng);
    mcast_close(&eng->mc); /* leaves every group */
    close(eng->fd); /* the port is free now; the memory and the eventfd go with the last reference */
    close(eng->epfd);
    free(eng->rbuf);
    free(eng->sbuf);
    bufpool_close(eng->rxpool); /* deliveries still held hand their buffers back to it later */
    batch_free(eng);
    auth_free(&eng->auth);
    replay_free(&eng->replay);
    engine_unref(eng);
}

int p2p_engine_address(p2p_engine *eng, char *host_out, uint16_t *port_out) {
    inet_ntop(AF_INET, &eng->local.sin_addr, host_out, 16);
    *port_out = ntohs(eng->local.sin_port);
    return 0;
}

void p2p_engine_counters(p2p_engine *eng, p2p_counters *out) {
    const uint64_t *src = (const uint64_t *)&eng->counters;
    uint64_t *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

int p2p_path_chunk_size(p2p_engine *eng, const char *host, uint32_t *out) {
    struct sockaddr_in to;
    int rc = parse_ipv4(host, 9, &to);
    if (rc) return rc;
    uint32_t dgram = eng->cfg.max_datagram;
    if (!dgram) {
        /* The route's MTU: a connected UDP socket reports it without sending anything. */
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        int mtu = 1500;
        socklen_t ml = sizeof mtu;
        if (s >= 0 && connect(s, (struct sockaddr *)&to, sizeof to) == 0)
            getsockopt(s, IPPROTO_IP, IP_MTU, &mtu, &ml);
        if (s >= 0) close(s);
        dgram = mtu > 65535 ? WIRE_MAX_DATAGRAM : (uint32_t)mtu - 28;
        if (dgram > WIRE_MAX_DATAGRAM) dgram = WIRE_MAX_DATAGRAM;
    }
    uint32_t c = (dgram - WIRE_HDR) & ~7u;
    *out = c > MAX_CHUNK ? MAX_CHUNK : c;
    return 0;
}

void engine_wait(p2p_engine *eng, int (*ready)(const void *), const void *arg, int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    }
    int rc = 0;
    while (!ready(arg) && rc == 0 && timeout_ms != 0) {
        if (timeout_ms < 0) pthread_cond_wait(&eng->cv, &eng->mu);
        else rc = pthread_cond_timedwait(&eng->cv, &eng->mu, &until);
    }
}

/* Bytes of each segment covered by the chunks set in bitmap: one walk over chunks and segments. */
void segment_coverage(const uint8_t *bitmap, uint32_t nchunks, uint32_t chunk, uint64_t meta_len,
                             const uint64_t *seg_off, const uint64_t *seg_len, uint32_t nseg, uint64_t *out) {
    uint32_t seg = 0;
    memset(out, 0, sizeof(uint64_t) * nseg);
    for (uint32_t k = 0; k < nchunks; k++) {
        if (!BIT_GET(bitmap, k)) continue;
        uint64_t a = (uint64_t)k * chunk, b = a + chunk;
        a = a > meta_len ? a - meta_len : 0;
        b = b > meta_len ? b - meta_len : 0;
        while (seg < nseg && seg_off[seg] + seg_len[seg] <= a) seg++;
        for (uint32_t i = seg; i < nseg && seg_off[i] < b; i++) {
            uint64_t lo = a > seg_off[i] ? a : seg_off[i];
            uint64_t hi = b < seg_off[i] + seg_len[i] ? b : seg_off[i] + seg_len[i];
            if (hi > lo) out[i] += hi - lo;
        }
    }
}
