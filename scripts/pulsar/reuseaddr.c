/*
 * Preloaded into the Pulsar standalone JVM by scripts/pulsar.sh: sets
 * SO_REUSEADDR on every TCP socket before it binds.
 *
 * A broker stopped under load leaves connections on its ports in TIME_WAIT
 * for a minute, and the BookKeeper bookie inside standalone binds without
 * SO_REUSEADDR, so a restart on the same ports (which clients must find
 * again) waited up to two minutes. With this a restart takes seconds, which
 * the nemesis campaign needs for its many Pulsar restarts. SO_REUSEADDR
 * still refuses a port another socket is listening on.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/socket.h>

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real_bind)(int, const struct sockaddr *, socklen_t);
    if (!real_bind) {
        real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    }
    int type = 0;
    socklen_t type_len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_STREAM) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    }
    return real_bind(fd, addr, len);
}
