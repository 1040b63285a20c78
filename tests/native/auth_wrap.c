/* auth.c's IV rule at the counter's wrap: the datagram after counter 2^32 - 2 gets 2^32 - 1 no more; a
 * new random session starts at 0, so (session, counter) never repeats under a key. Every sealed
 * datagram still checks at its destination, and fails with a byte changed anywhere or at any other
 * destination (another address or port). Exits non-zero on any failure. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "wire.h"

int set_error(int err, const char *fmt, ...) { (void)fmt; return err < 0 ? err : -err; }

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c); return 1; } } while (0)

int main(void) {
    uint8_t key[AUTH_KEY];
    for (int i = 0; i < AUTH_KEY; i++) key[i] = (uint8_t)(7 * i + 1);
    struct auth a;
    CHECK(auth_init(&a, key, 42) == 0);
    a.stream.counter = UINT32_MAX - 1;
    uint8_t dg[3][WIRE_HDR + 100];
    struct auth_dest to = {htonl(0x0A000002), 7000}; /* 10.0.0.2:7000 */
    for (int k = 0; k < 3; k++) {
        memset(dg[k], 0, sizeof dg[k]);
        struct wire_hdr h = {.type = T_DATA, .sender = 5, .msg = 9, .chunk = (uint32_t)k, .nchunks = 3, .chunk_size = 96};
        wire_put_hdr(dg[k], &h);
        memset(dg[k] + WIRE_HDR, 'a' + k, 100);
        struct iovec body = {dg[k] + WIRE_HDR, 100};
        auth_seal(&a, &a.stream, &to, dg[k], &body, 1);
        CHECK(auth_check(&a, &to, dg[k], sizeof dg[k]));
    }
    struct wire_hdr h0, h1, h2;
    CHECK(!wire_get_hdr(dg[0], sizeof dg[0], &h0) && !wire_get_hdr(dg[1], sizeof dg[1], &h1) &&
          !wire_get_hdr(dg[2], sizeof dg[2], &h2));
    CHECK(h0.counter == UINT32_MAX - 1 && h1.counter == 0 && h2.counter == 1);
    CHECK(h1.session != h0.session && h2.session == h1.session && h0.job == 42);
    for (size_t at = 0; at < sizeof dg[2]; at++) { /* the tag covers every byte */
        dg[2][at] ^= 0x10;
        CHECK(!auth_check(&a, &to, dg[2], sizeof dg[2]));
        dg[2][at] ^= 0x10;
    }
    struct auth_dest other_port = {to.addr, 7001}, other_host = {htonl(0x0A000003), 7000};
    CHECK(!auth_check(&a, &other_port, dg[2], sizeof dg[2]) && !auth_check(&a, &other_host, dg[2], sizeof dg[2]));
    auth_free(&a);
    puts("auth_wrap: ok");
    return 0;
}
