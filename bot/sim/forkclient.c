/* bot/sim/forkclient.py's fast path in C: hand one simulated tool call to this user's
 * fork server (bot/sim/forkserver.py) and stand in for the tool until it ends.
 *
 * Why: each simulated tool call started an interpreter (python -S, about 8 ms of CPU,
 * more than the call's own work in the fork server); the test suite makes tens of
 * thousands of them on two cores. This does the same in well under a millisecond.
 *
 * Invoked as  forkclient -S <path>/forkclient.py <tool> ARGS...  (bot/sim/bin/<tool>):
 * the same arguments after argv[0] as the Python client's, so the simulated ps and
 * pgrep (bot.sim.procfs.tool_argv) see the process as the tool, as before. Whenever the
 * fast path cannot be taken (no server, another user's, any error before the call was
 * handed over), it execs the Python client with those arguments, which decides as ever.
 * The request, the signals forwarded and the way it exits are the Python client's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

static int server = -1;
static const int CATCH[] = {1, 2, 3, 10, 12, 14, 15}; /* HUP INT QUIT USR1 USR2 ALRM TERM */

static void fallback(char **argv) {
    const char *python = getenv("SIM_PYTHON");
    if (python == NULL || *python == '\0') python = "python3";
    argv[0] = (char *)python;
    execvp(python, argv);
    perror("simulated tool: cannot run the Python client");
    _exit(127);
}

static void forward(int signo) {
    int saved = errno;
    unsigned char b = (unsigned char)signo;
    (void)!send(server, &b, 1, MSG_NOSIGNAL);
    errno = saved;
}

/* Append n bytes to the growing buffer; 0 on failure. */
static int put(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t want = (*cap ? *cap : 4096);
        while (want < *len + n + 1) want *= 2;
        char *grown = realloc(*buf, want);
        if (grown == NULL) return 0;
        *buf = grown;
        *cap = want;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    return 1;
}

int main(int argc, char **argv) {
    /* argv: [client, "-S", forkclient.py, tool, args...] */
    const char *path = getenv("SIM_FORK_SOCKET");
    if (argc < 4 || path == NULL || *path == '\0') fallback(argv);
    struct stat st;
    if (stat(path, &st) != 0 || st.st_uid != geteuid()) fallback(argv);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) fallback(argv);
    strcpy(addr.sun_path, path);
    server = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (server < 0) fallback(argv);
    if (connect(server, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(server);
        fallback(argv);
    }

    /* NUL-separated: umask, cwd, argc, the arguments, then the environment. */
    mode_t mask = umask(0);
    umask(mask);
    char cwd[8192];
    if (getcwd(cwd, sizeof cwd) == NULL) fallback(argv);
    char *buf = NULL;
    size_t len = 8, cap = 0;
    char num[32];
    int ok = put(&buf, &len, &cap, "", 0);
    memset(buf, 0, 8); /* room for the length prefix */
    snprintf(num, sizeof num, "%u", (unsigned)mask);
    ok = ok && put(&buf, &len, &cap, num, strlen(num) + 1);
    ok = ok && put(&buf, &len, &cap, cwd, strlen(cwd) + 1);
    snprintf(num, sizeof num, "%d", argc - 3);
    ok = ok && put(&buf, &len, &cap, num, strlen(num) + 1);
    for (int i = 3; i < argc; i++) ok = ok && put(&buf, &len, &cap, argv[i], strlen(argv[i]) + 1);
    for (char **e = environ; *e != NULL; e++) ok = ok && put(&buf, &len, &cap, *e, strlen(*e) + 1);
    if (!ok) fallback(argv);
    len -= 1; /* the Python client joins with NUL: no NUL after the last entry */
    uint64_t size = len - 8;
    for (int i = 0; i < 8; i++) buf[i] = (char)(size >> (56 - 8 * i));

    int fds[3] = {0, 1, 2};
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    /* The first sendmsg carries the descriptors; whatever it did not take follows. */
    ssize_t sent = sendmsg(server, &msg, MSG_NOSIGNAL);
    if (sent <= 0) fallback(argv);
    while ((size_t)sent < len) {
        ssize_t n = send(server, buf + sent, len - (size_t)sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            fputs("simulated tool: the fork server went away\n", stderr);
            _exit(255);
        }
        sent += n;
    }
    free(buf);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof CATCH / sizeof CATCH[0]; i++) sigaction(CATCH[i], &sa, NULL);

    char reply[64];
    size_t got = 0;
    while (got == 0 || reply[got - 1] != '\n') {
        if (got >= sizeof reply - 1) break;
        ssize_t n = recv(server, reply + got, sizeof reply - 1 - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            fputs("simulated tool: the fork server went away\n", stderr);
            _exit(255);
        }
        got += (size_t)n;
    }
    reply[got] = '\0';
    int code = 0;
    if (sscanf(reply, "signal %d", &code) == 1) {
        /* Die of the same signal, as the tool did: the caller sees what it would have. */
        signal(code, SIG_DFL);
        sigset_t all;
        sigemptyset(&all);
        sigaddset(&all, code);
        sigprocmask(SIG_UNBLOCK, &all, NULL);
        kill(getpid(), code);
        _exit(128 + code);
    }
    if (sscanf(reply, "exit %d", &code) != 1) code = 255;
    _exit(code);
}
