/* The agent's side of the zygote: see zygote.h for what it is and its wire. */
#include "zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ZYGOTE_FD        3
#define MAX_STARTS       4      /* one that keeps dying before it is ready is given up */
#define REPORT_MS        5000   /* a fork that takes longer means a stuck zygote */
#define SEND_TIMEOUT_S   1

static char *spec;        /* the ZYGOTE payload, kept to start it again */
static size_t spec_len;
static pid_t zpid;        /* 0 = none running */
static int zfd = -1;      /* our end of its socket */
static int ready;
static int starts;

pid_t zygote_pid(void) { return zpid; }

static void close_socket(void)
{
    if (zfd >= 0)
        close(zfd);
    zfd = -1;
    ready = 0;
}

/* Kill it; the reaper collects it (it is our child). */
static void end_zygote(void)
{
    if (zpid > 0)
        killpg(zpid, SIGKILL);
    zpid = 0;
    close_socket();
}

void zygote_stop(void) { end_zygote(); }

void zygote_reaped(pid_t pid)
{
    if (pid == zpid) {
        zpid = 0;
        close_socket();
    }
}

/* Runs in the forked child: becomes the zygote's program or exits 127. */
static void zygote_child(const struct run_req *r, int sock)
{
    static const unsigned long default_action[4];
    sigset_t none;

    setsid();
    prctl(PR_SET_PDEATHSIG, SIGKILL);   /* it must never outlive the agent */
    for (int s = 1; s < NSIG; s++)
        signal(s, SIG_DFL);
    for (int s = 32; s < SIGRTMIN; s++)   /* see run_child in agent.c */
        syscall(SYS_rt_sigaction, s, default_action, NULL, (NSIG - 1) / 8);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(2, 1) < 0)   /* never our stdout: the frames */
        _exit(127);
    if (sock == ZYGOTE_FD ? fcntl(sock, F_SETFD, 0) < 0 : dup2(sock, ZYGOTE_FD) < 0)
        _exit(127);
#if defined(SYS_close_range) && defined(CLOSE_RANGE_CLOEXEC)
    syscall(SYS_close_range, ZYGOTE_FD + 1, ~0U, CLOSE_RANGE_CLOEXEC);
#endif
    int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (oom >= 0) {
        if (write(oom, "1000", 4) < 0) { /* best effort */ }
        close(oom);
    }
    if (r->cwd[0] && chdir(r->cwd) < 0)
        _exit(127);
    for (size_t i = 0; i < r->envc; i++)
        putenv(r->env[i]);
    /* room in its environment for the marker of each run it forks (protocol.h) */
    setenv(CUBICLE_RUN_MARKER, CUBICLE_RUN_MARKER_ZYGOTE, 1);
    execvp(r->argv[0], r->argv);
    _exit(127);
}

static void start(void)
{
    struct run_req r;
    int sv[2];
    char *copy;

    if (!spec || starts >= MAX_STARTS || zpid)
        return;
    /* wire_parse_run points into its buffer and the child's environment
     * keeps pointers into it: a copy of its own, freed only in the parent */
    if (!(copy = malloc(spec_len ? spec_len : 1)))
        return;
    memcpy(copy, spec, spec_len);
    if (wire_parse_run(copy, spec_len, &r) ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        wire_free_run(&r);
        free(copy);
        return;
    }
    /* Its runs' processes are orphaned to us, so we can wait for them. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    starts++;
    pid_t pid = fork();
    if (pid == 0)
        zygote_child(&r, sv[1]);
    close(sv[1]);
    wire_free_run(&r);
    free(copy);
    if (pid < 0) {
        close(sv[0]);
        return;
    }
    struct timeval tv = { SEND_TIMEOUT_S, 0 };
    setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    zpid = pid;
    zfd = sv[0];
    ready = 0;
}

const char *zygote_configure(const char *payload, size_t len)
{
    struct run_req r;
    char *copy = malloc(len ? len : 1);

    if (!copy)
        return "out of memory";
    memcpy(copy, payload, len);
    const char *bad = wire_parse_run(copy, len, &r);
    wire_free_run(&r);
    if (bad) {
        free(copy);
        return bad;
    }
    end_zygote();
    free(spec);
    spec = copy;
    spec_len = len;
    starts = 0;
    start();
    return NULL;
}

/* Has it said it is ready?  Never waits. */
static int is_ready(void)
{
    char c;

    if (ready)
        return 1;
    ssize_t n = recv(zfd, &c, 1, MSG_DONTWAIT);
    if (n == 1 && c == 'R') {
        starts = 0;   /* only zygotes that never get ready count against the limit */
        return ready = 1;
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) || n == 1)
        end_zygote();   /* gone, or it said something it should not */
    return 0;
}

static int put(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t want = (*len + n + 1) * 2;
        char *nb = realloc(*buf, want);
        if (!nb)
            return -1;
        *buf = nb;
        *cap = want;
    }
    memcpy(*buf + *len, s, n);
    (*buf)[*len + n] = '\0';
    *len += n + 1;
    return 0;
}

/* The request in the zygote's framing: length first, then the fields. */
static char *encode_request(const struct run_req *r, size_t *out_len)
{
    char num[24];
    size_t len = 4, cap = 256, argc = 0;
    char *buf = malloc(cap);
    int bad = !buf;

    while (r->argv[argc])
        argc++;
    bad = bad || put(&buf, &len, &cap, r->cwd, strlen(r->cwd));
    snprintf(num, sizeof num, "%zu", argc);
    bad = bad || put(&buf, &len, &cap, num, strlen(num));
    for (size_t i = 0; !bad && i < argc; i++)
        bad = put(&buf, &len, &cap, r->argv[i], strlen(r->argv[i]));
    snprintf(num, sizeof num, "%zu", r->envc);
    bad = bad || put(&buf, &len, &cap, num, strlen(num));
    for (size_t i = 0; !bad && i < r->envc; i++)
        bad = put(&buf, &len, &cap, r->env[i], strlen(r->env[i]));
    if (bad) {
        free(buf);
        return NULL;
    }
    uint32_t body = (uint32_t)(len - 4);
    buf[0] = (char)(body >> 24);
    buf[1] = (char)(body >> 16);
    buf[2] = (char)(body >> 8);
    buf[3] = (char)body;
    *out_len = len;
    return buf;
}

/* Sends the whole request, the fds with its first byte. */
static int send_request(const char *buf, size_t len, const int fds[4])
{
    union {
        struct cmsghdr hdr;
        char space[CMSG_SPACE(4 * sizeof(int))];
    } control;
    size_t off = 0;

    while (off < len) {
        struct iovec iov = { (char *)buf + off, len - off };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        if (off == 0) {
            memset(&control, 0, sizeof control);
            msg.msg_control = control.space;
            msg.msg_controllen = sizeof control.space;
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(4 * sizeof(int));
            memcpy(CMSG_DATA(c), fds, 4 * sizeof(int));
        }
        ssize_t n = sendmsg(zfd, &msg, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;   /* gone, or stuck past SO_SNDTIMEO */
        off += (size_t)n;
    }
    return 0;
}

/* Reads "PID STATUS\n" from the report pipe; the pid, or 0 if the run is
 * not the zygote's (refused, or no answer in time). */
static pid_t read_report(int fd, int *stuck)
{
    char buf[64];
    size_t got = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    *stuck = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        long left = REPORT_MS - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd p = { fd, POLLIN, 0 };
        /* past the deadline, a last look: a report that made it must count,
         * or the run would start twice (here and through exec) */
        int ready_fds = poll(&p, 1, left > 0 ? (int)left : 0);
        if (ready_fds < 0 && errno == EINTR)
            continue;
        if (ready_fds <= 0 && left <= 0) {
            *stuck = 1;
            return 0;
        }
        if (!p.revents)
            continue;
        ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
        if (memchr(buf, '\n', got) || got == sizeof buf - 1)
            break;
    }
    buf[got] = '\0';
    int pid, status;
    if (sscanf(buf, "%d %d", &pid, &status) != 2 || pid <= 1) {
        *stuck = 1;   /* died before it could say: something is wrong with it */
        return 0;
    }
    return status == 0 ? (pid_t)pid : 0;   /* a refused run's process exits by itself */
}

pid_t zygote_fork(const struct run_req *r, int in_r, int out_w, int err_w)
{
    int rep[2];
    size_t len;
    pid_t pid = 0;
    int stuck = 0;

    if (!zpid)
        start();   /* ready for a later run; this one is exec'd */
    if (!zpid || zfd < 0 || !is_ready())
        return 0;
    char *buf = encode_request(r, &len);
    if (!buf)
        return 0;
    if (pipe2(rep, O_CLOEXEC) < 0) {
        free(buf);
        return 0;
    }
    int fds[4] = { in_r, out_w, err_w, rep[1] };
    int sent = send_request(buf, len, fds);
    free(buf);
    close(rep[1]);
    if (sent == 0)
        pid = read_report(rep[0], &stuck);
    close(rep[0]);
    if (sent < 0 || stuck)
        end_zygote();   /* started again at the next FORK */
    return pid;
}
