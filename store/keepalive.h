/* Internal: TCP keepalive and TCP_USER_TIMEOUT on the store's sockets (client and server side),
 * so that a peer that vanished without a reset (power loss, a cut link) is noticed by the kernel
 * well within MT_TIMEOUT_S instead of after the hours of the system defaults. */
#ifndef MT_STORE_KEEPALIVE_H
#define MT_STORE_KEEPALIVE_H

/* The settings derived from a timeout T (seconds): unacknowledged data or unanswered probes for
 * user_timeout_ms end the connection; probes start after idle_s of silence, every interval_s,
 * count of them. They add up to about T/3 (at least 1 s each). */
typedef struct mt_store_keepalive {
    int idle_s, interval_s, count;
    unsigned user_timeout_ms;
} mt_store_keepalive;

void mt_store_keepalive_for(double timeout_s, mt_store_keepalive *out);

/* Applies the settings for timeout_s to a connected TCP socket. Returns 0, or an errno when
 * the kernel refused one (the caller decides whether that matters). */
int mt_store_keepalive_apply(int fd, double timeout_s);

/* What every store connection gets, on both ends: TCP_NODELAY (requests and replies are small
 * frames) and the keepalive for MT_TIMEOUT_S. Returns 0, or the errno of the keepalive (the
 * caller decides whether that matters). */
int mt_store_socket_tune(int fd);

#endif
