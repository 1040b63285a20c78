/* The engine alone under AddressSanitizer with leak detection (`make asan`): no Python, so every
 * leak reported is the engine's. Runs what a peer does and what can go wrong around it: tagged
 * messages under loss, a replay, garbage datagrams, undelivered messages and sends in flight at
 * close, deliveries dropped for the queue's quota and left waiting at close, close while another
 * thread is blocked in p2p_recv, and multicast sends (through a group
 * where loopback carries multicast, else by the fallback to unicast). Exits non-zero on any failure. */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "p2pcast.h"

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, #cond, p2p_last_error()); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

#define MCAST_PORT 47399

static p2p_engine *open_engine_mc(uint16_t id, double drop, uint16_t mcast_port, uint32_t max_queued) {
    p2p_config cfg;
    p2p_config_default(&cfg);
    cfg.max_queued_messages = max_queued;
    cfg.sender_id = id;
    cfg.job_id = 7;
    for (int i = 0; i < 32; i++) cfg.key[i] = (uint8_t)(i + 1);
    cfg.drop_prob = drop;
    cfg.seed = id;
    cfg.rx_idle_ms = 300;
    cfg.mcast_port = mcast_port;
    p2p_engine *e = NULL;
    CHECK(p2p_engine_open(&cfg, &e) == 0);
    return e;
}

static p2p_engine *open_engine(uint16_t id, double drop) { return open_engine_mc(id, drop, 0, 0); }

static uint16_t port_of(p2p_engine *e) {
    char host[16];
    uint16_t port;
    p2p_engine_address(e, host, &port);
    return port;
}

static p2p_send *send_to(p2p_engine *from, p2p_engine *to, uint32_t msg, const float *x, size_t n, double bound,
                         uint32_t deadline_ms) {
    p2p_segment seg = {x, n * sizeof *x, bound};
    p2p_receiver rcv = {"127.0.0.1", port_of(to), 0, 0};
    p2p_send_options opt = {.deadline_ms = deadline_ms, .app = "f4", .app_len = 2};
    p2p_send *s = NULL;
    CHECK(p2p_send_start(from, msg, &seg, 1, &rcv, 1, &opt, &s) == 0);
    return s;
}

static void *blocked_recv(void *arg) {
    p2p_engine *e = arg;
    p2p_delivery *d = NULL;
    int rc;
    while ((rc = p2p_recv(e, -1, &d)) == 0) p2p_delivery_free(d); /* until the engine is closed under it */
    CHECK(rc < 0);
    p2p_engine_release(e);
    return NULL;
}

int main(void) {
    size_t n = 1 << 20;
    float *x = malloc(n * sizeof *x);
    CHECK(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)i;

    /* Messages under 5% loss, exact and within a bound; each arrives, and its delivery is freed. */
    p2p_engine *a = open_engine(1, 0), *b = open_engine(2, 0.05);
    for (uint32_t msg = 1; msg <= 3; msg++) {
        p2p_send *s = send_to(a, b, msg, x, n, msg == 1 ? 0 : 0.1, 0);
        p2p_delivery *d = NULL;
        CHECK(p2p_recv(b, 10000, &d) == 0 && d->msg_id == msg);
        if (msg == 1) CHECK(memcmp(d->data, x, n * sizeof *x) == 0);
        p2p_delivery_free(d);
        CHECK(p2p_send_wait(s, 10000) == 0);
        p2p_send_release(s);
    }

    /* Slow close: a paced receiver that gets a fifth of what is sent ends SLOW, its cut delivery freed. */
    p2p_engine *lossy = open_engine(3, 0.8);
    p2p_segment part = {x, 100000 * sizeof *x, 0};
    p2p_receiver paced = {"127.0.0.1", port_of(lossy), 2e6, 0};
    p2p_send_options slow_opt = {.slow_factor = 2, .app = "f4", .app_len = 2};
    p2p_send *ss = NULL;
    CHECK(p2p_send_start(a, 9, &part, 1, &paced, 1, &slow_opt, &ss) == 0);
    CHECK(p2p_send_wait(ss, 10000) == 0);
    p2p_receiver_stats st;
    CHECK(p2p_send_receiver_stats(ss, 0, &st, NULL, 0) == 0 && st.result == P2P_SEND_SLOW);
    p2p_send_release(ss);
    p2p_delivery *cut = NULL;
    CHECK(p2p_recv(lossy, 10000, &cut) == 0 && cut->reason == P2P_DELIVERED_CLOSED);
    p2p_delivery_free(cut);
    p2p_counters counters;
    p2p_engine_counters(a, &counters);
    CHECK(counters.slow_closed == 1);
    p2p_engine_close(lossy);

    /* Garbage and a replay from another socket: dropped and counted, nothing delivered. */
    int raw = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port_of(b))};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    uint8_t junk[1500];
    srand(1);
    for (int i = 0; i < 2000; i++) {
        size_t len = (size_t)(rand() % (int)sizeof junk);
        for (size_t k = 0; k < len; k++) junk[k] = (uint8_t)rand();
        if (len >= 4 && i % 2) { junk[0] = 0x32; junk[1] = 0x70; junk[2] = 2; junk[3] = (uint8_t)(1 + i % 5); }
        sendto(raw, junk, len, 0, (struct sockaddr *)&to, sizeof to);
    }
    close(raw);
    p2p_delivery *none = NULL;
    CHECK(p2p_recv(b, 500, &none) == 1);

    /* Multicast to two receivers (one lossy), exact and within a bound; then one left in flight at close. */
    p2p_engine *m[3] = {open_engine_mc(5, 0, MCAST_PORT, 0), open_engine_mc(6, 0, MCAST_PORT, 0),
                        open_engine_mc(7, 0.05, MCAST_PORT, 0)};
    p2p_segment seg = {x, n * sizeof *x, 0};
    p2p_receiver group[2] = {{"127.0.0.1", port_of(m[1]), 0, 1}, {"127.0.0.1", port_of(m[2]), 0, 1}};
    p2p_send_options opt = {.app = "f4", .app_len = 2};
    for (uint32_t msg = 1; msg <= 3; msg++) {
        seg.loss_bound = msg == 1 ? 0 : 0.1;
        p2p_send *ms = NULL;
        CHECK(p2p_send_start(m[0], msg, &seg, 1, group, 2, &opt, &ms) == 0);
        for (int i = 1; i <= 2; i++) {
            p2p_delivery *d = NULL;
            CHECK(p2p_recv(m[i], 10000, &d) == 0 && d->msg_id == msg);
            if (msg == 1) CHECK(memcmp(d->data, x, n * sizeof *x) == 0);
            p2p_delivery_free(d);
        }
        CHECK(p2p_send_wait(ms, 10000) == 0);
        p2p_send_release(ms);
    }
    p2p_send *inflight = NULL;
    CHECK(p2p_send_start(m[0], 4, &seg, 1, group, 2, &opt, &inflight) == 0);
    p2p_engine_close(m[1]);
    p2p_engine_close(m[0]);
    p2p_engine_close(m[2]);
    CHECK(p2p_send_wait(inflight, 0) == 0);
    p2p_send_release(inflight);

    /* A receiver with room for 4 that takes nothing: the oldest 6 of 10 are dropped and counted, 2
     * are taken, and close frees the 2 still waiting (and their source's record). */
    p2p_engine *q = open_engine_mc(8, 0, 0, 4);
    for (uint32_t msg = 1; msg <= 10; msg++) {
        p2p_send *qs = send_to(a, q, msg, x, 256, 0, 0);
        CHECK(p2p_send_wait(qs, 10000) == 0); /* (q sends DONE once the delivery is queued) */
        p2p_send_release(qs);
    }
    p2p_counters qc;
    p2p_engine_counters(q, &qc);
    CHECK(qc.drop_queue_full == 6 && qc.queued_messages == 4);
    for (uint32_t msg = 7; msg <= 8; msg++) {
        p2p_delivery *d = NULL;
        CHECK(p2p_recv(q, 0, &d) == 0 && d->msg_id == msg);
        p2p_delivery_free(d);
    }
    p2p_engine_close(q);

    /* Left open at close: a message b never took, a send to a peer that is gone, a partial message. */
    p2p_send *s = send_to(a, b, 10, x, n, 0, 0);
    CHECK(p2p_send_wait(s, 10000) == 0);
    p2p_send_release(s);
    p2p_engine *gone = open_engine(3, 0);
    p2p_send *lost = send_to(a, gone, 11, x, n, 0, 0);
    p2p_engine_close(gone);
    p2p_engine *c = open_engine(4, 0.5); /* a lossy receiver left with a partial message */
    p2p_send *partial = send_to(a, c, 12, x, n, 0, 200);

    /* Close while another thread waits in p2p_recv (it holds a reference, as Channel does). */
    pthread_t t;
    p2p_engine_hold(c);
    CHECK(pthread_create(&t, NULL, blocked_recv, c) == 0);
    usleep(100000);
    p2p_engine_close(c);
    CHECK(pthread_join(t, NULL) == 0);

    p2p_engine_close(a);
    CHECK(p2p_send_wait(lost, 0) == 0 && p2p_send_wait(partial, 0) == 0);
    p2p_send_release(lost);
    p2p_send_release(partial);
    p2p_engine_close(b);
    free(x);
    puts("engine_leaks: ok");
    return 0;
}
