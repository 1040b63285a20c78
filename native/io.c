/* The I/O thread: one epoll loop over the engine's UDP sockets (unicast, and multicast if on). It has datagram.c read what arrived,
 * lets tx.c send what pacing allows, and runs both sides' timers. Python never runs here. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "batch.h"
#include "io.h"

#define SWEEP_NS 20000000ull

static void set_want_out(p2p_engine *eng, int on) {
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.fd = eng->fd};
    epoll_ctl(eng->epfd, EPOLL_CTL_MOD, eng->fd, &ev);
}

/* Waits for socket or wake-up events, at most wait_ns; returns how many (0 also when interrupted). */
static int wait_events(p2p_engine *eng, struct epoll_event *evs, int max, uint64_t wait_ns) {
    int n = 0;
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
        dgram_drain(eng, eng->fd, 0);
        if (eng->mc.fd >= 0) dgram_drain(eng, eng->mc.fd, 1);
        now = now_ns();
        tx_timers(eng, now);
        if (now - eng->last_sweep_ns > ACK_DELAY_NS) {
            rx_timers(eng, now);
            mcast_sweep(&eng->mc, now);
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
    struct delivery_priv *unread = NULL;
    pthread_mutex_lock(&eng->mu);
    while (eng->dq_head) {
        struct delivery_priv *d = eng->dq_head;
        dq_remove(eng, d, NULL); /* (frees the sources' records with their last delivery) */
        d->next = unread;
        unread = d;
    }
    pthread_mutex_unlock(&eng->mu);
    deliveries_free(unread);
}

int io_init(p2p_engine *eng) {
    return batch_init(eng);
}
