/* The calling thread's last error message (p2p_last_error), set where a call fails. Shared by the
 * engine and the compute module: each compiled module holds its own copy, so each reports its own. */
#ifndef P2P_ERROR_H
#define P2P_ERROR_H

/* Records the message for p2p_last_error() and returns err as a negative errno-style code (err may
 * be given with either sign). */
int set_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
