/* TCP keepalive and user timeout for the store's connections (store/keepalive.h). */
#include "store/keepalive.h"
#include <meshtrain/store.h> /* mt_default_timeout */

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

void mt_store_keepalive_for(double timeout_s, mt_store_keepalive *out) {
    if (!(timeout_s > 0) || !isfinite(timeout_s)) timeout_s = 300;
    /* A third of the timeout for the kernel to give up: a dead peer is then reported by the
     * failing call itself, with time left for mtrun to stop the ranks and say why before the
     * other nodes' own MT_TIMEOUT_S runs out. Keepalive starts at a sixth and probes three
     * times at a twelfth; the user timeout bounds the probes and unacknowledged data alike. */
    double third = timeout_s / 3.0;
    out->user_timeout_ms = third < 1.0 ? 1000u : third > 3600.0 ? 3600000u
                                                                 : (unsigned)(third * 1000.0);
    double idle = timeout_s / 6.0, interval = timeout_s / 12.0;
    out->idle_s = idle < 1.0 ? 1 : idle > 3600.0 ? 3600 : (int)idle;
    out->interval_s = interval < 1.0 ? 1 : interval > 600.0 ? 600 : (int)interval;
    out->count = 3;
}

int mt_store_keepalive_apply(int fd, double timeout_s) {
    mt_store_keepalive k;
    mt_store_keepalive_for(timeout_s, &k);
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0) return errno;
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k.idle_s, sizeof k.idle_s) != 0) return errno;
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k.interval_s, sizeof k.interval_s) != 0)
        return errno;
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k.count, sizeof k.count) != 0) return errno;
    if (setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &k.user_timeout_ms,
                   sizeof k.user_timeout_ms) != 0)
        return errno;
    return 0;
}

int mt_store_socket_tune(int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* latency only */
    return mt_store_keepalive_apply(fd, mt_default_timeout());
}
