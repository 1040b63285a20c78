/* IP multicast group handling (mcast.c), for both sides of a multicast send.
 *
 * A sender's data goes once to its group: group_of(sender) = base + sender % count, on the job's
 * multicast port. A receiver joins a sender's group only when that sender announces a message to it
 * (T_JOIN, unicast and authenticated) and accepts a multicast datagram only for a message announced
 * so (rx.c), so peers sharing a group (count below the number of senders) or a member that stays
 * joined between messages never take in a message not meant for them. Memberships are counted per
 * open message and left once unused for MCAST_LINGER_NS (so back-to-back rounds from one sender do
 * not churn IGMP), at the oldest unused one when the quota is reached, and all at close.
 * Tuning: max_joined bounds memberships per engine (the kernel's net.ipv4.igmp_max_memberships,
 * 20 by default, bounds them per socket): a receiver with more senders at once than that gets the
 * rest by unicast. I/O thread only, but for mcast_open and mcast_close. */
#ifndef P2P_MCAST_H
#define P2P_MCAST_H
#include <netinet/in.h>
#include <stdint.h>
/* p2p_config: include after p2pcast.h (a cdef source, without include guards) */

#define MCAST_LINGER_NS 2000000000ull

struct mgroup {
    uint32_t addr;                /* group, network order; 0 = free slot */
    uint32_t refs;                /* incoming messages announced through it and still open */
    uint64_t unused_ns;           /* when refs last fell to 0 */
};

struct mcast {
    int fd;                       /* owned: bound to 0.0.0.0:port, receives the groups joined; -1 = multicast off */
    uint16_t port;                /* the job's multicast port (host order) */
    uint32_t base, count;         /* group range, host order */
    struct in_addr ifaddr;        /* interface to join on (the engine's bound address; INADDR_ANY = by route) */
    uint32_t max_joined;
    struct mgroup *groups;        /* owned, max_joined slots */
};

/* Multicast off when cfg->mcast_port is 0 (fd stays -1). Otherwise opens the receiving socket and
 * sets the sending socket's TTL, loopback and interface. 0, or a negative errno with p2p_last_error set. */
int mcast_open(struct mcast *mc, const p2p_config *cfg, int send_fd, struct in_addr ifaddr);
/* Leaves every group and closes the socket. */
void mcast_close(struct mcast *mc);
/* The group and port sender's data goes to. */
void mcast_group_of(const struct mcast *mc, uint16_t sender, struct sockaddr_in *out);
/* Joins addr (or counts one more message on it): the slot, or a negative errno (off, quota, kernel). */
int mcast_join(struct mcast *mc, uint32_t addr);
/* One message fewer on a slot mcast_join returned. */
void mcast_release(struct mcast *mc, int slot, uint64_t now);
/* Leaves the groups unused for MCAST_LINGER_NS. */
void mcast_sweep(struct mcast *mc, uint64_t now);

#endif
