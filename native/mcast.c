/* IP multicast group handling (mcast.h): the receiving socket, memberships and the group range. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h" /* p2pcast.h, mcast.h, set_error */

#ifndef IP_MULTICAST_ALL
#define IP_MULTICAST_ALL 49
#endif

#define DEFAULT_BASE "239.77.0.0"
#define DEFAULT_GROUPS 65536u
#define DEFAULT_MAX_JOINED 16u

static int membership(const struct mcast *mc, uint32_t addr, int op) {
    struct ip_mreqn req = {.imr_multiaddr.s_addr = addr, .imr_address = mc->ifaddr};
    return setsockopt(mc->fd, IPPROTO_IP, op, &req, sizeof req) == 0 ? 0 : -errno;
}

int mcast_open(struct mcast *mc, const p2p_config *cfg, int send_fd, struct in_addr ifaddr) {
    memset(mc, 0, sizeof *mc);
    mc->fd = -1;
    if (!cfg->mcast_port) return 0;
    struct in_addr base;
    const char *text = cfg->mcast_group_base ? cfg->mcast_group_base : DEFAULT_BASE;
    if (inet_pton(AF_INET, text, &base) != 1) return set_error(EINVAL, "mcast_group_base: not an IPv4 address: '%s'", text);
    mc->base = ntohl(base.s_addr);
    mc->count = cfg->mcast_groups ? cfg->mcast_groups : DEFAULT_GROUPS;
    if ((mc->base >> 28) != 0xE || mc->count > 0xEFFFFFFFu - mc->base + 1)
        return set_error(EINVAL, "multicast groups %s + %u leave 224.0.0.0/4", text, mc->count);
    mc->port = cfg->mcast_port;
    mc->ifaddr = ifaddr;
    mc->max_joined = cfg->mcast_max_joined ? cfg->mcast_max_joined : DEFAULT_MAX_JOINED;
    if (!(mc->groups = calloc(mc->max_joined, sizeof *mc->groups))) return set_error(ENOMEM, "out of memory");

    unsigned char ttl = cfg->mcast_ttl ? cfg->mcast_ttl : 1, loop = 1;
    int zero = 0, one = 1;
    if (setsockopt(send_fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl) < 0 ||
        setsockopt(send_fd, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop) < 0 ||
        (ifaddr.s_addr != INADDR_ANY && setsockopt(send_fd, IPPROTO_IP, IP_MULTICAST_IF, &ifaddr, sizeof ifaddr) < 0))
        return set_error(errno, "multicast sending options: %s", strerror(errno));
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(mc->port)};
    mc->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (mc->fd < 0) return set_error(errno, "socket: %s", strerror(errno));
    /* Several engines of a host share the port (each gets its own copy of the groups it joined);
     * without IP_MULTICAST_ALL a socket would also get every group any other socket joined. */
    if (setsockopt(mc->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        setsockopt(mc->fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero) < 0 ||
        bind(mc->fd, (struct sockaddr *)&at, sizeof at) < 0)
        return set_error(errno, "multicast socket on port %u: %s", mc->port, strerror(errno));
    return 0;
}

void mcast_close(struct mcast *mc) {
    if (mc->fd >= 0) {
        for (uint32_t i = 0; i < mc->max_joined; i++)
            if (mc->groups[i].addr) membership(mc, mc->groups[i].addr, IP_DROP_MEMBERSHIP);
        close(mc->fd);
    }
    free(mc->groups);
    mc->groups = NULL;
    mc->fd = -1;
}

void mcast_group_of(const struct mcast *mc, uint16_t sender, struct sockaddr_in *out) {
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_addr.s_addr = htonl(mc->base + sender % mc->count);
    out->sin_port = htons(mc->port);
}

int mcast_join(struct mcast *mc, uint32_t addr) {
    if (mc->fd < 0) return -EOPNOTSUPP;
    int free_slot = -1, unused = -1; /* a free slot, else the one unused for longest */
    for (uint32_t i = 0; i < mc->max_joined; i++) {
        struct mgroup *g = &mc->groups[i];
        if (g->addr == addr) {
            g->refs++;
            return (int)i;
        }
        if (!g->addr) {
            if (free_slot < 0) free_slot = (int)i;
        } else if (!g->refs && (unused < 0 || g->unused_ns < mc->groups[unused].unused_ns)) {
            unused = (int)i;
        }
    }
    int slot = free_slot >= 0 ? free_slot : unused;
    if (slot < 0) return -ENOBUFS;
    struct mgroup *g = &mc->groups[slot];
    if (g->addr) membership(mc, g->addr, IP_DROP_MEMBERSHIP);
    g->addr = 0;
    int rc = membership(mc, addr, IP_ADD_MEMBERSHIP);
    if (rc) return rc;
    g->addr = addr;
    g->refs = 1;
    return slot;
}

void mcast_release(struct mcast *mc, int slot, uint64_t now) {
    struct mgroup *g = &mc->groups[slot];
    if (--g->refs == 0) g->unused_ns = now;
}

void mcast_sweep(struct mcast *mc, uint64_t now) {
    for (uint32_t i = 0; mc->fd >= 0 && i < mc->max_joined; i++) {
        struct mgroup *g = &mc->groups[i];
        if (g->addr && !g->refs && now - g->unused_ns > MCAST_LINGER_NS) {
            membership(mc, g->addr, IP_DROP_MEMBERSHIP);
            g->addr = 0;
        }
    }
}
