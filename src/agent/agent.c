/*
 * cubicle-agent: the in-sandbox process runner.
 *
 * Runs as the container's main process (under tini, unprivileged) and
 * executes programs on behalf of the cubicle server.  The server speaks to
 * it over the container's attach stream: request frames arrive on stdin,
 * response frames leave on stdout; or, when the server mounted its socket at
 * CUBICLE_AGENT_CHANNEL, over that socket, both ways, from the HELLO on.
 * stderr carries diagnostics only.
 *
 * The frames and their types are defined in protocol.h; wire.c decodes them.
 *
 * RUN starts a one-shot program: its payload ends with the whole of its
 * stdin, which is closed once written.  OPEN (same payload) starts a
 * long-lived session, e.g. an interpreter running many code cells: its stdin
 * stays open for STDIN frames (an empty one closes it), output caps do not
 * apply, and it gets a control pipe as fd 3 whose bytes come back as CONTROL
 * frames, each only after all stdout/stderr the child wrote before them.
 * START is a RUN whose stdin stays open for STDIN frames (a background run
 * the model feeds input to); its output caps apply and it has no fd 3.
 * SIGNAL (payload: the number, in decimal) signals an execution's process
 * group.  SAVE (payload: "CAP\0DIR") keeps a copy of an execution's output,
 * up to CAP bytes per stream, in DIR/stdout and DIR/stderr (DIR is created);
 * it applies to the running execution of that id, or else to the next one
 * started with it, and for a session it replaces the previous files (one
 * SAVE per cell).  The copy ignores the forwarding cap, so it is complete.
 *
 * The agent is single-threaded: one poll() loop multiplexes its own stdin,
 * every child's stdout/stderr/control/stdin pipe and a signalfd for SIGCHLD,
 * with the nearest deadline (timeout or post-exit drain) as the poll timeout.
 *
 * Started as `cubicle-agent --proxy PORT [ALLOW ...]` it is instead the
 * sandboxes' egress proxy (proxy.c) and speaks no frames at all.
 *
 * `cubicle-agent --sandbox` (what the server starts inside its containers)
 * also kills what a program detached from its session: see "ending
 * processes".  Without it (the host-side tests, a developer running the
 * binary) only the program's own process group is ever signalled.  With
 * `--memory-limit BYTES` besides, it holds the programs to that much memory
 * (memory.h), which the container's own limit cannot tell from their files.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "changed.h"
#include "checkpoint.h"
#include "dial.h"
#include "memory.h"
#include "paths.h"
#include "procfs.h"
#include "remove.h"
#include "textfile.h"
#include "proxy.h"
#include "relay.h"
#include "reset.h"
#include "search.h"
#include "streams.h"
#include "wire.h"
#include "zygote.h"

#define CHUNK       (64 * 1024)   /* read size for child output */
#define DRAIN_US    100000        /* how long to drain pipes after exit */

#define CONTROL_FD 3   /* where OPEN children find their control pipe */

/* One running (or draining) execution. */
struct exec {
    struct exec *next;
    uint32_t id;
    pid_t pid;              /* main child; also its session and process group id */
    int out[2];             /* read ends of child stdout/stderr, -1 = closed */
    int ctl_fd;             /* read end of the control pipe, -1 = none/closed */
    int in_fd;              /* write end of child stdin, -1 = closed */
    char *in_buf;           /* queued stdin data not yet written (owned) */
    size_t in_len, in_off;
    int in_eof;             /* close stdin once the queue is written */
    uint64_t cap;           /* per-stream output cap, 0 = none */
    uint64_t sent[2];       /* bytes forwarded per stream */
    int truncated, timed_out, killed, exited, status;
    int memory_killed;      /* a process of its session was killed at the memory limit */
    int builtin;            /* the agent's own code (changed.h): starts no process */
    int save_fd[2];         /* SAVE copies of stdout/stderr, -1 = none */
    uint64_t save_cap, saved[2];
    struct rusage ru;
    int64_t start_us, deadline_us, end_us;  /* deadline 0 = none */
};

/* What the child reports through its CLOEXEC pipe if it cannot exec. */
enum { STAGE_SETUP, STAGE_CHDIR, STAGE_EXEC };
struct child_err { int stage, err; };

/* A SAVE that arrived before its execution started. */
struct save {
    struct save *next;
    uint32_t id;
    uint64_t cap;
    char dir[];
};

/* How an execution is started: RUN, OPEN (session) or START. */
enum mode { M_RUN, M_OPEN, M_START };

static struct exec *execs;
static struct save *saves;
static int sig_fd = -1;

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- ending processes -------------------------------------------------
 *
 * A run ends with every process it started, whatever session or group they
 * moved to; what must outlive it is a live execution of its own (a
 * background run, an interpreter and the children of its cells).
 *
 * Every child starts a session of its own, so everything it starts stays in
 * that session unless it calls setsid() (a daemon's double fork does).  A
 * session cannot be joined from outside, so "in the session of a live
 * execution" tells most of the processes we must spare.  Those that left
 * their session are told by RUN_MARKER, which every execution's environment
 * carries and every process it starts inherits; a process that clears it, or
 * makes its environment unreadable, gives up that protection.  Whenever an
 * execution ends -- normally, at a timeout, by a kill or with us -- its
 * process group goes, and so does every process of our uid that is neither
 * us, nor the zygote, nor in the session of a live execution, nor marked as
 * one's.  The environment is read only for processes no session spares
 * (usually none), so the common end costs one read of /proc/PID/stat per
 * process.  Processes of other uids (other workspaces of a shared container)
 * are never touched: we have no capability to signal them, and we do not
 * try.
 *
 * Sweeping by uid is only right where every process of that uid belongs to
 * the sandbox, so it is an explicit opt-in (`--sandbox`, passed only by the
 * server when it starts us inside a container it made) and never done as
 * root whatever the flag says.  Without the flag the agent signals nothing
 * but its own children's process groups: run on a host as root it would
 * otherwise kill the whole machine (it once did, in a test), and run as a
 * developer's own uid (1000 on most desktops) it would kill their desktop
 * session -- the flag is the only thing that protects the latter, since the
 * uid alone cannot tell a sandbox from a workstation. */
static int sweep_enabled;

/* "CUBICLE_RUN=<exec id>" in every execution's environment (protocol.h). */
#define RUN_MARKER CUBICLE_RUN_MARKER "="

/* Where frames come from and go to: the attach stream, or the server's socket. */
static int server_in = STDIN_FILENO, server_out = STDOUT_FILENO;

/* Connects to the server's socket when it mounted one (protocol.h); -1 when
 * there is none or it does not answer (a shared-workspace agent, whose
 * container's agent took the one connection): the attach stream serves. */
static int connect_channel(void)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    strcpy(addr.sun_path, CUBICLE_AGENT_CHANNEL);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0)
        return fd;
    if (errno != ENOENT && errno != ECONNREFUSED)
        fprintf(stderr, "cubicle-agent: %s: %s; using the attach stream\n", CUBICLE_AGENT_CHANNEL, strerror(errno));
    close(fd);
    return -1;
}

#define SWEEP_PASSES 200   /* a forking process may add children between passes */

/* Real uid of a process from /proc; -1 if it is gone. */
static int proc_uid(pid_t pid, uid_t *uid)
{
    char buf[1024];

    if (read_proc(pid, "status", buf, sizeof buf) < 0)
        return -1;
    char *u = strstr(buf, "\nUid:");
    unsigned long real;
    if (!u || sscanf(u + 5, "%lu", &real) != 1)
        return -1;
    *uid = (uid_t)real;
    return 0;
}

static int live(const struct exec *e)
{
    return !e->exited && !e->killed;
}

/* Is sid the session of an execution we must spare? */
static int spared_session(pid_t sid)
{
    for (struct exec *e = execs; e; e = e->next)
        if (live(e) && e->pid == sid)
            return 1;
    return sid == zygote_pid() && sid > 0;   /* it runs no program's code */
}

/* Is one environment entry the marker of a live execution? */
static int names_live(const char *entry)
{
    char *end;
    size_t n = strlen(RUN_MARKER);

    if (strncmp(entry, RUN_MARKER, n) != 0 || !entry[n])
        return 0;
    unsigned long id = strtoul(entry + n, &end, 10);
    if (*end)
        return 0;
    for (struct exec *e = execs; e; e = e->next)
        if (live(e) && e->id == id)
            return 1;
    return 0;
}

/* Does the environment a process started with carry the marker of a live
 * execution?  No when it cannot be read: the process is nobody's. */
static int marked_live(pid_t pid)
{
    char path[64], buf[4096], entry[32];
    size_t have = 0;   /* length of the current entry; its start is in `entry` */
    ssize_t n;
    int found = 0, fd;

    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    if ((fd = open_at(path, O_RDONLY | O_CLOEXEC, 0)) < 0)
        return 0;
    while (!found && (n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n && !found; i++) {
            if (buf[i]) {
                if (have < sizeof entry - 1)
                    entry[have] = buf[i];
                have++;
                continue;
            }
            if (have < sizeof entry) {
                entry[have] = 0;
                found = names_live(entry);
            }
            have = 0;
        }
    }
    close(fd);
    return found;
}

/* One pass over /proc: SIGKILL every live process of our uid that no live
 * execution owns.  Returns how many it signalled, or -1 when /proc cannot
 * be read. */
static int sweep_pass(void)
{
    DIR *d = opendir_at("/proc");
    struct dirent *de;
    pid_t self = getpid();
    uid_t me = getuid();
    int hits = 0;

    if (!d)
        return -1;
    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        pid_t sid;
        char state;
        uid_t uid;
        /* The session first: after a program ends, only the processes no
         * session spares (usually none) cost more reads.  Many sandboxes'
         * agents share a workspace host's /proc. */
        if (*end || pid <= 1 || pid == self || proc_session((pid_t)pid, &sid, &state) < 0)
            continue;
        if (state == 'Z' || state == 'X' || spared_session(sid))
            continue;
        if (proc_uid((pid_t)pid, &uid) < 0 || uid != me || marked_live((pid_t)pid))
            continue;
        if (kill((pid_t)pid, SIGKILL) == 0)
            hits++;
    }
    closedir(d);
    return hits;
}

/* Repeats passes until one finds nothing left: a process may fork between
 * our reading /proc and our signal, but not once it is dead. */
static void sweep(void)
{
    static const struct timespec pause = { 0, 1000000 };
    if (!sweep_enabled || getuid() == 0)   /* checked again here: see above */
        return;
    for (int pass = 0; pass < SWEEP_PASSES; pass++) {
        if (sweep_pass() <= 0)
            return;
        nanosleep(&pause, NULL);
    }
}

/* An execution that is no longer live (exited or killed) ends with its
 * process group and whatever no live execution owns. */
static void end_exec(struct exec *e)
{
    killpg(e->pid, SIGKILL);
    sweep();
}

/* A timeout or a kill. */
static void kill_exec(struct exec *e)
{
    e->killed = 1;
    end_exec(e);
}

/* Every execution and every process of our uid but the zygote's. */
static void end_executions(void)
{
    for (struct exec *e = execs; e; e = e->next)
        if (!e->exited) {
            e->killed = 1;
            killpg(e->pid, SIGKILL);
        }
    sweep();
}

/* Used when we are about to exit: nothing of ours may outlive us. */
static void kill_all(void)
{
    zygote_stop();
    end_executions();
}

static void die(int code, const char *why)
{
    if (why)
        fprintf(stderr, "cubicle-agent: %s\n", why);
    kill_all();
    exit(code);
}

/*
 * Write one whole frame.  stdout is shared by all executions, so a frame
 * must go out completely before anything else is written; short writes and
 * EINTR are retried.  If the server is gone there is nothing left to do.
 */
static void send_frame(uint8_t type, uint32_t id, const void *data, size_t len)
{
    unsigned char hdr[CUBICLE_FRAME_HEADER_SIZE];
    struct iovec iov[2] = { { hdr, sizeof hdr }, { (void *)data, len } };
    struct iovec *v = iov;
    int cnt = 2;

    wire_put_header(hdr, type, id, len);
    while (cnt > 0) {
        ssize_t n = writev(server_out, v, cnt);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {   /* someone made our stdout nonblocking */
                struct pollfd p = { server_out, POLLOUT, 0 };
                poll(&p, 1, -1);
                continue;
            }
            die(1, "writing to stdout failed; server gone");
        }
        while (cnt > 0 && (size_t)n >= v->iov_len) {
            n -= (ssize_t)v->iov_len;
            v++;
            cnt--;
        }
        if (cnt > 0) {
            v->iov_base = (char *)v->iov_base + n;
            v->iov_len -= (size_t)n;
        }
    }
}

#define send_error(id, ...) wire_send_error(send_frame, (id), __VA_ARGS__)

static struct exec *find_exec(uint32_t id)
{
    for (struct exec *e = execs; e; e = e->next)
        if (e->id == id)
            return e;
    return NULL;
}

static int exec_id_taken(uint32_t id) { return find_exec(id) != NULL; }

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void set_nonblock(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* ---- child side ------------------------------------------------------ */

static void child_fail(int fd, int stage)
{
    struct child_err ce = { stage, errno };
    if (write(fd, &ce, sizeof ce) < 0) {
        /* nothing we can do; the parent sees a successful exec + exit 127 */
    }
    _exit(127);
}

/* Make every fd >= 3 close on exec, so nothing of ours leaks into the child
 * while the error pipe stays usable until exec succeeds. */
static void cloexec_from_3(void)
{
    fds_range(3, ~0U, 0);
}

/* Give an OPEN child its control pipe as fd 3, the only fd above 2 that
 * survives exec.  Runs after cloexec_from_3, so every other fd is CLOEXEC. */
static void install_control_fd(int ctl_w, int *ep)
{
    if (*ep == CONTROL_FD) {   /* keep the error pipe from being clobbered */
        int moved = fcntl(*ep, F_DUPFD_CLOEXEC, CONTROL_FD + 1);
        if (moved < 0)
            child_fail(*ep, STAGE_SETUP);
        *ep = moved;
    }
    if (ctl_w == CONTROL_FD ? fcntl(ctl_w, F_SETFD, 0) < 0 : dup2(ctl_w, CONTROL_FD) < 0)
        child_fail(*ep, STAGE_SETUP);
}

/* The runs the agent serves itself (protocol.h): their main, or NULL. */
typedef int (*builtin_fn)(int argc, char **argv);

static builtin_fn builtin_named(const char *argv0)
{
    if (strcmp(argv0, CUBICLE_BUILTIN_CHANGED_FILES) == 0)
        return changed_files_main;
    if (strcmp(argv0, CUBICLE_BUILTIN_REMOVE) == 0)
        return remove_main;
    if (strcmp(argv0, CUBICLE_BUILTIN_SEARCH) == 0)
        return search_main;
    if (strcmp(argv0, CUBICLE_BUILTIN_READ_FILE) == 0)
        return read_file_main;
    if (strcmp(argv0, CUBICLE_BUILTIN_REPLACE_FILE) == 0)
        return replace_file_main;
    return NULL;
}

/* Runs in the forked child; never returns.  The agent is single-threaded,
 * so using non-async-signal-safe libc calls (putenv) after fork is fine.
 * ctl_w is the control pipe's write end for OPEN, -1 for RUN. */
static void run_child(const struct run_req *r, int in_r, int out_w, int err_w, int ctl_w,
                      int ep)
{
    sigset_t none;

    /* A session of its own (also a process group): what the program starts
     * stays in it unless it leaves on purpose.  Cannot fail: the child of a
     * fork is never a group leader. */
    setsid();
    for (int s = 1; s < NSIG; s++)   /* agent ignores SIGPIPE, etc. */
        signal(s, SIG_DFL);
    /* glibc's signal() refuses its own two real-time signals, but a parent
     * may have left them ignored (GNU make 4.3 does) and exec keeps that.
     * An all-zero kernel sigaction is SIG_DFL in every architecture's layout. */
    static const unsigned long default_action[4];
    for (int s = 32; s < SIGRTMIN; s++)
        syscall(SYS_rt_sigaction, s, default_action, NULL, (NSIG - 1) / 8);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);   /* agent blocks SIGCHLD */

    if (dup2(in_r, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
        child_fail(ep, STAGE_SETUP);
    cloexec_from_3();
    if (ctl_w >= 0)
        install_control_fd(ctl_w, &ep);
    /* When the sandbox runs out of memory the kernel must pick the program,
     * never the agent; raising one's own score needs no privilege. */
    int oom = open_at("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC, 0);
    if (oom >= 0) {
        if (write(oom, "1000", 4) < 0) { /* best effort: /proc may be absent */ }
        close(oom);
    }
    if (r->cwd[0] && chdir_at(r->cwd) < 0)
        child_fail(ep, STAGE_CHDIR);
    /* Overrides go into our own environment so that a PATH override also
     * governs the executable lookup, like `env PATH=... prog`. */
    for (size_t i = 0; i < r->envc; i++)
        if (putenv(r->env[i]) != 0)
            child_fail(ep, STAGE_SETUP);
    builtin_fn builtin = builtin_named(r->argv[0]);
    if (builtin) {
        int argc = 0;
        while (r->argv[argc])
            argc++;
        paths_close_others();   /* closes ep too: "it runs", the agent stops waiting for an exec */
        _exit(builtin(argc, r->argv));
    }
    execvp(r->argv[0], r->argv);
    child_fail(ep, STAGE_EXEC);
}

/* ---- RUN / OPEN handling --------------------------------------------- */

/* ---- saved output (SAVE) --------------------------------------------- */

static void save_close(struct exec *e)
{
    close_fd(&e->save_fd[0]);
    close_fd(&e->save_fd[1]);
}

/* mkdir -p, as the sandbox user: the directory is the program's as much as ours. */
static int make_dirs(const char *dir)
{
    char path[PATH_MAX];
    const char *rest;
    int at = path_at(dir, &rest);
    size_t len = strlen(rest);

    if (len == 0 || len >= sizeof path)
        return -1;
    memcpy(path, rest, len + 1);
    for (char *p = path + 1; ; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdirat(at, path, 0755) < 0 && errno != EEXIST)
            return -1;
        *p = c;
        if (c == '\0')
            return 0;
    }
}

static int open_saved(const char *dir, const char *name)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path)
        return -1;
    return open_at(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
}

/* Start (or, for a session's next cell, restart) saving e's output in dir.
 * Saving is best effort: a file that cannot be written is closed and the
 * output still reaches the server. */
static void save_open(struct exec *e, uint64_t cap, const char *dir)
{
    save_close(e);
    e->save_cap = cap;
    e->saved[0] = e->saved[1] = 0;
    if (!dir[0])
        return;
    if (make_dirs(dir) < 0) {
        fprintf(stderr, "cubicle-agent: cannot create %s: %s\n", dir, strerror(errno));
        return;
    }
    e->save_fd[0] = open_saved(dir, "stdout");
    e->save_fd[1] = open_saved(dir, "stderr");
}

static void save_output(struct exec *e, int s, const char *buf, size_t n)
{
    if (e->save_fd[s] < 0)
        return;
    if (e->save_cap && n > e->save_cap - e->saved[s])
        n = (size_t)(e->save_cap - e->saved[s]);
    while (n > 0) {
        ssize_t w = write(e->save_fd[s], buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close_fd(&e->save_fd[s]);
            return;
        }
        buf += w;
        n -= (size_t)w;
        e->saved[s] += (uint64_t)w;
    }
}

/* The SAVE waiting for the execution `id`, if any; the caller frees it. */
static struct save *take_save(uint32_t id)
{
    for (struct save **pp = &saves; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            struct save *s = *pp;
            *pp = s->next;
            return s;
        }
    }
    return NULL;
}

#define MAX_WAITING_SAVES 64

static void handle_save(uint32_t id, const char *payload, size_t len)
{
    const char *nul = memchr(payload, 0, len);
    char num[24];
    uint64_t cap;
    struct exec *e;

    if (!nul || (size_t)(nul - payload) >= sizeof num) {
        send_error(id, "malformed SAVE");
        return;
    }
    memcpy(num, payload, (size_t)(nul - payload) + 1);
    size_t dir_len = len - (size_t)(nul - payload) - 1;
    if (wire_parse_u64(num, &cap) || memchr(nul + 1, 0, dir_len) || dir_len >= PATH_MAX) {
        send_error(id, "malformed SAVE");
        return;
    }
    e = find_exec(id);
    if (e && !e->exited) {
        char dir[PATH_MAX];
        memcpy(dir, nul + 1, dir_len);
        dir[dir_len] = '\0';
        save_open(e, cap, dir);
        return;
    }
    free(take_save(id));
    size_t waiting = 0;
    for (struct save *s = saves; s; s = s->next)
        waiting++;
    if (waiting >= MAX_WAITING_SAVES)   /* never started: the oldest go */
        free(take_save(saves->id));
    struct save *s = malloc(sizeof *s + dir_len + 1);
    if (!s)
        return;
    s->id = id;
    s->cap = cap;
    memcpy(s->dir, nul + 1, dir_len);
    s->dir[dir_len] = '\0';
    s->next = saves;
    saves = s;
}

/* SIGNAL: deliver a signal to an execution's process group. */
static void handle_signal(uint32_t id, const char *payload, size_t len)
{
    char num[8];
    uint64_t sig;
    struct exec *e = find_exec(id);

    if (len == 0 || len >= sizeof num)
        return;
    memcpy(num, payload, len);
    num[len] = '\0';
    if (wire_parse_u64(num, &sig) || sig == 0 || sig >= NSIG || !e || e->exited)
        return;
    killpg(e->pid, (int)sig);
}

static void close_pair(int p[2])
{
    close_fd(&p[0]);
    close_fd(&p[1]);
}

/* Wait for the child's verdict on exec.  EOF on the error pipe means exec
 * succeeded (CLOEXEC closed it); otherwise report why and reap the child. */
static int exec_failed(uint32_t id, pid_t pid, int ep, const struct run_req *r)
{
    struct child_err ce;
    ssize_t n;

    do
        n = read(ep, &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof ce)
        return 0;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    if (ce.stage == STAGE_CHDIR)
        send_error(id, "cannot chdir to '%s': %s", r->cwd, strerror(ce.err));
    else if (ce.stage == STAGE_EXEC)
        send_error(id, "cannot run '%s': %s", r->argv[0], strerror(ce.err));
    else
        send_error(id, "cannot set up child for '%s': %s", r->argv[0], strerror(ce.err));
    return 1;
}

static void clear_stdin_queue(struct exec *e)
{
    free(e->in_buf);
    e->in_buf = NULL;
    e->in_len = e->in_off = 0;
}

static void close_stdin(struct exec *e)
{
    close_fd(&e->in_fd);
    clear_stdin_queue(e);
}

/* Append to the stdin queue; the poll loop writes it out as the pipe
 * accepts it.  Returns -1 if out of memory. */
static int queue_stdin(struct exec *e, const char *data, size_t len)
{
    if (e->in_off) {   /* drop what was written so the queue cannot creep */
        memmove(e->in_buf, e->in_buf + e->in_off, e->in_len - e->in_off);
        e->in_len -= e->in_off;
        e->in_off = 0;
    }
    char *nb = realloc(e->in_buf, e->in_len + len);
    if (!nb)
        return -1;
    memcpy(nb + e->in_len, data, len);
    e->in_buf = nb;
    e->in_len += len;
    return 0;
}

/* Fork and exec one RUN, OPEN or START.  On success the execution joins
 * the poll loop; otherwise an ERROR frame is sent and nothing is left behind. */
static void spawn(uint32_t id, const struct run_req *r, enum mode mode,
                  const struct save *save, int via_zygote)
{
    int session = mode == M_OPEN;
    int in[2] = { -1, -1 }, out[2] = { -1, -1 }, err[2] = { -1, -1 }, ep[2] = { -1, -1 };
    int ctl[2] = { -1, -1 };
    struct exec *e = calloc(1, sizeof *e);
    struct run_req marked = *r;   /* r with RUN_MARKER ("ending processes") */
    char marker[sizeof RUN_MARKER + 10];

    marked.env = calloc(r->envc + 2, sizeof *marked.env);
    if (marked.env)
        memcpy(marked.env, r->env, r->envc * sizeof *r->env);
    if (e)
        e->in_fd = e->ctl_fd = e->out[0] = e->out[1] = e->save_fd[0] = e->save_fd[1] = -1;
    /* queue the initial stdin before forking: afterwards we could not fail
     * without leaving a running child behind */
    if (!e || !marked.env || (r->in_len && queue_stdin(e, r->in, r->in_len))) {
        send_error(id, "out of memory");
        goto fail;
    }
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
        pipe2(ep, O_CLOEXEC) || (session && pipe2(ctl, O_CLOEXEC))) {
        send_error(id, "cannot create pipes: %s", strerror(errno));
        goto fail;
    }
    /* The marker goes last, so that it wins over the request's own. */
    snprintf(marker, sizeof marker, RUN_MARKER "%u", id);
    marked.env[marked.envc++] = marker;
    e->start_us = now_us();
    /* A FORK's process comes from the zygote when it can (its session
     * exists once zygote_fork returns); otherwise it is an ordinary RUN. */
    pid_t pid = via_zygote ? zygote_fork(&marked, in[0], out[1], err[1]) : 0;
    if (pid == 0 && (pid = fork()) == 0)
        run_child(&marked, in[0], out[1], err[1], ctl[1], ep[1]);
    if (pid < 0) {
        send_error(id, "cannot fork: %s", strerror(errno));
        goto fail;
    }
    /* The child's setsid() happens before exec, and exec_failed waits for the
     * exec: once it returns, the session exists. */
    close_fd(&in[0]);
    close_fd(&out[1]);
    close_fd(&err[1]);
    close_fd(&ctl[1]);
    close_fd(&ep[1]);
    if (exec_failed(id, pid, ep[0], r))
        goto fail;

    e->id = id;
    e->pid = pid;
    e->builtin = builtin_named(r->argv[0]) != NULL;
    e->out[0] = out[0];
    e->out[1] = err[0];
    e->ctl_fd = ctl[0];
    e->in_fd = in[1];
    out[0] = err[0] = ctl[0] = in[1] = -1;   /* now owned by e */
    e->cap = session ? 0 : r->cap;   /* a session's output is never capped */
    /* clamp absurd timeouts instead of overflowing the deadline */
    if (r->timeout_ms)
        e->deadline_us = e->start_us + 1000 * (int64_t)(r->timeout_ms < 1000000000000ULL
                                                        ? r->timeout_ms : 1000000000000ULL);
    set_nonblock(e->out[0]);
    set_nonblock(e->out[1]);
    set_nonblock(e->in_fd);
    if (e->ctl_fd >= 0)
        set_nonblock(e->ctl_fd);
    /* A RUN's stdin is complete from the start; a session's or a START's
     * stays open for STDIN frames until an empty one arrives. */
    e->in_eof = mode == M_RUN;
    if (e->in_eof && !e->in_len)
        close_stdin(e);   /* no stdin data: child sees EOF at once */
    if (save)
        save_open(e, save->cap, save->dir);
    e->next = execs;
    execs = e;
    e = NULL;
fail:
    if (e)
        close_stdin(e);
    free(e);
    free(marked.env);
    close_pair(in);
    close_pair(out);
    close_pair(err);
    close_pair(ctl);
    close_pair(ep);
}

/* RUN, OPEN and START share the payload layout. */
static void handle_run(uint32_t id, char *payload, size_t len, enum mode mode, int via_zygote)
{
    const char *what = mode == M_OPEN ? "OPEN" : mode == M_START ? "START" : "RUN";
    struct run_req r;
    const char *bad = wire_parse_run(payload, len, &r);
    struct save *save = take_save(id);

    if (bad)
        send_error(id, "malformed %s: %s", what, bad);
    else if (id == 0)
        send_error(id, "malformed %s: exec id 0 is reserved", what);
    else if (find_exec(id) || streams_has(id))
        send_error(id, "exec id %u is already in use", id);
    else
        spawn(id, &r, mode, save, via_zygote);
    free(save);
    wire_free_run(&r);
}

/* STDIN: more input for an execution whose stdin is still open; an empty
 * payload closes it once the queue is written.  A RUN's stdin counts as
 * closed from the start (its RUN payload held all of it), so only sessions
 * take STDIN.  Anything else is dropped silently: the execution may just
 * have ended, which the server learns from its EXIT frame. */
static void handle_stdin(uint32_t id, const char *data, size_t len)
{
    struct exec *e = find_exec(id);

    if (!e || e->in_fd < 0 || e->in_eof)
        return;
    if (len == 0) {
        e->in_eof = 1;
        if (e->in_off == e->in_len)
            close_stdin(e);
    } else if (queue_stdin(e, data, len)) {
        /* cannot keep the stream intact: end it rather than skip bytes */
        close_stdin(e);
    }
}

/* RESET (recycling a throwaway container, reset.h): every execution ends with
 * its EXIT frame, every other process of our uid but the zygote (which never
 * runs a program's code, and which runs cannot trace) dies by the sweep, then
 * the wipe and the verification, whose verdict is the CLEAN frame. */
static void finish(struct exec *e);
static void reap(void);

static void handle_reset(uint32_t id)
{
    const char *refusal = reset_refusal(sweep_enabled);
    char report[2048];

    if (refusal) {
        send_error(id, "%s", refusal);
        return;
    }
    streams_close_all("the sandbox was reset");
    end_executions();
    while (execs) {
        struct exec *e = execs;
        if (!e->exited) {
            while (wait4(e->pid, &e->status, 0, &e->ru) < 0 && errno == EINTR)
                ;
            e->exited = 1;
            e->end_us = now_us();
        }
        execs = e->next;
        finish(e);
    }
    while (saves) {
        struct save *s = saves;
        saves = s->next;
        free(s);
    }
    sweep();   /* what forked while the executions were reaped */
    reset_wipe();
    reset_verify(report, sizeof report, zygote_pid(), reap);
    send_frame(CUBICLE_FRAME_CLEAN, id, report, strlen(report));
}

/* RESTORE and DROP (checkpoint.h): a parked copy of a live interpreter goes
 * live in its execution's place, or is killed. */
static void handle_checkpoint(uint8_t type, uint32_t id, const char *payload, size_t len)
{
    uint32_t exec_id = 0;
    pid_t pid = 0;
    const char *bad = checkpoint_parse(payload, len, &exec_id, &pid);
    struct exec *e = bad ? NULL : find_exec(exec_id);

    if (!bad && (!e || !live(e) || e->builtin || e->pid == pid))
        bad = "the interpreter is not running";
    if (!bad)
        bad = checkpoint_refusal(pid, exec_id);
    if (bad) {
        if (type == CUBICLE_FRAME_RESTORE)
            send_error(id, "cannot restore the checkpoint: %s", bad);
        return;
    }
    if (type == CUBICLE_FRAME_DROP) {
        kill(pid, SIGKILL);   /* reaped by its parent, or by us once orphaned */
        return;
    }
    /* The live process and its session go; its parked copies, orphaned, come
     * to us, so that the copy can be this execution's process. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    killpg(e->pid, SIGKILL);
    while (wait4(e->pid, &e->status, 0, &e->ru) < 0 && errno == EINTR)
        ;
    siginfo_t info = { 0 };
    if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) < 0) {
        /* not ours to wait for (cannot happen while copies are only ever
         * children of a live interpreter): the interpreter is lost */
        kill(pid, SIGKILL);
        e->exited = 1;
        e->end_us = now_us();
        close_stdin(e);
        sweep();
        return;
    }
    e->pid = pid;
    checkpoint_wake(pid);
}

static void handle_frame(uint8_t type, uint32_t id, unsigned char *payload, size_t len)
{
    struct exec *e;

    switch (type) {
    case CUBICLE_FRAME_RUN:
    case CUBICLE_FRAME_OPEN:
    case CUBICLE_FRAME_START:
        handle_run(id, (char *)payload, len,
                   type == CUBICLE_FRAME_OPEN ? M_OPEN : type == CUBICLE_FRAME_START ? M_START : M_RUN, 0);
        break;
    case CUBICLE_FRAME_FORK:
        handle_run(id, (char *)payload, len, M_RUN, 1);
        break;
    case CUBICLE_FRAME_ZYGOTE: {
        const char *bad = zygote_configure((const char *)payload, len);
        if (bad)
            send_error(id, "malformed ZYGOTE: %s", bad);
        break;
    }
    case CUBICLE_FRAME_SIGNAL:
        handle_signal(id, (const char *)payload, len);
        break;
    case CUBICLE_FRAME_SAVE:
        handle_save(id, (const char *)payload, len);
        break;
    case CUBICLE_FRAME_STDIN:
        handle_stdin(id, (const char *)payload, len);
        break;
    case CUBICLE_FRAME_KILL:
        e = find_exec(id);
        if (e && !e->exited)   /* an exited one's session is already dead */
            kill_exec(e);
        break;
    case CUBICLE_FRAME_PING:
        send_frame(CUBICLE_FRAME_PONG, id, payload, len);
        break;
    case CUBICLE_FRAME_RESET:
        handle_reset(id);
        break;
    case CUBICLE_FRAME_RESTORE:
    case CUBICLE_FRAME_DROP:
        handle_checkpoint(type, id, (const char *)payload, len);
        break;
    case CUBICLE_FRAME_CONNECT:
    case CUBICLE_FRAME_DATA:
    case CUBICLE_FRAME_SHUT:
    case CUBICLE_FRAME_WINDOW:
        streams_handle(type, id, payload, len);
        break;
    default:
        send_error(id, "unknown frame type 0x%02x", type);
        break;
    }
}

/* ---- server input ---------------------------------------------------- */

static unsigned char *ibuf;
static size_t ilen, icap;

/* Read what the server sent and dispatch every complete frame.  Frames may
 * arrive split across reads or several per read. */
static void read_input(void)
{
    struct frame_header h;
    size_t want = ilen + CHUNK;
    if (ilen >= CUBICLE_FRAME_HEADER_SIZE && wire_get_header(ibuf, &h) == 0 &&
        CUBICLE_FRAME_HEADER_SIZE + h.len > want)
        want = CUBICLE_FRAME_HEADER_SIZE + h.len;
    if (want > icap) {
        unsigned char *nb = realloc(ibuf, want);
        if (!nb)
            die(1, "out of memory for input buffer");
        ibuf = nb;
        icap = want;
    }

    ssize_t n = read(server_in, ibuf + ilen, icap - ilen);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n == 0)
        die(0, NULL);   /* server closed the connection */
    if (n < 0)
        die(1, "reading stdin failed");
    ilen += (size_t)n;

    size_t off = 0;
    while (ilen - off >= CUBICLE_FRAME_HEADER_SIZE) {
        if (wire_get_header(ibuf + off, &h)) {
            /* we cannot skip what we will not buffer: stream is lost */
            send_error(h.id, "frame payload of %u bytes exceeds the %u byte limit",
                       h.len, CUBICLE_FRAME_MAX_PAYLOAD);
            die(2, "oversized frame");
        }
        if (ilen - off - CUBICLE_FRAME_HEADER_SIZE < h.len)
            break;
        handle_frame(h.type, h.id, ibuf + off + CUBICLE_FRAME_HEADER_SIZE, h.len);
        off += CUBICLE_FRAME_HEADER_SIZE + h.len;
    }
    memmove(ibuf, ibuf + off, ilen - off);
    ilen -= off;
    if (ilen == 0 && icap > 4 * CHUNK) {   /* give back a big RUN's memory */
        free(ibuf);
        ibuf = NULL;
        icap = 0;
    }
}

/* ---- execution I/O and lifecycle ------------------------------------- */

/* Forward one chunk of child output, honouring the per-stream cap.  Beyond
 * the cap we keep reading and discarding so the child never blocks.
 * Returns the number of bytes read, 0 if none (nothing ready, or EOF). */
static size_t pump_output(struct exec *e, int s)
{
    static char buf[CHUNK];
    ssize_t n = e->out[s] < 0 ? 0 : read(e->out[s], buf, sizeof buf);

    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (n <= 0) {
        close_fd(&e->out[s]);
        return 0;
    }
    save_output(e, s, buf, (size_t)n);
    size_t fwd = (size_t)n;
    if (e->cap && fwd > e->cap - e->sent[s]) {
        fwd = (size_t)(e->cap - e->sent[s]);
        e->truncated = 1;
    }
    if (fwd) {
        send_frame(s ? CUBICLE_FRAME_STDERR : CUBICLE_FRAME_STDOUT, e->id, buf, fwd);
        e->sent[s] += fwd;
    }
    return (size_t)n;
}

/* Forward whatever stream s held when we were called, but no more: a child
 * that never stops writing must not keep us here. */
static void drain_output(struct exec *e, int s)
{
    int avail = 0;

    if (e->out[s] < 0)
        return;
    if (ioctl(e->out[s], FIONREAD, &avail) < 0)
        avail = INT_MAX;   /* never for a pipe; keep the order promise anyway */
    for (size_t left = (size_t)avail; left > 0;) {
        size_t n = pump_output(e, s);
        if (n == 0)
            break;
        left -= n < left ? n : left;
    }
}

/* Forward one chunk from the control pipe.  The child's output written before
 * these bytes is already in its stdout/stderr pipes by now, so forwarding
 * that first keeps the promised order.  Reading the control bytes before the
 * drain matters: drained first, control bytes written after the drain could
 * overtake output written in between. */
static void pump_control(struct exec *e)
{
    static char buf[CHUNK];
    ssize_t n = e->ctl_fd < 0 ? 0 : read(e->ctl_fd, buf, sizeof buf);

    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        close_fd(&e->ctl_fd);
        return;
    }
    drain_output(e, 0);
    drain_output(e, 1);
    send_frame(CUBICLE_FRAME_CONTROL, e->id, buf, (size_t)n);
}

/* Feed queued stdin as far as the pipe takes it; never block the agent.
 * Once the queue is empty, stdin closes if EOF was asked for (always so for
 * a RUN) and otherwise stays open for more. */
static void pump_stdin(struct exec *e)
{
    while (e->in_off < e->in_len) {
        ssize_t n = write(e->in_fd, e->in_buf + e->in_off, e->in_len - e->in_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0) {   /* EPIPE etc.: the child does not want more */
            close_stdin(e);
            return;
        }
        e->in_off += (size_t)n;
    }
    if (e->in_eof)
        close_stdin(e);
    else
        clear_stdin_queue(e);   /* a session's stdin waits for more */
}

/* The stdin pipe polled ready: write what is queued, or notice that the
 * child closed its end (POLLERR) while nothing was queued. */
static void service_stdin(struct exec *e, short revents)
{
    if (e->in_fd < 0)
        return;
    if (e->in_off < e->in_len)
        pump_stdin(e);
    else if (revents & (POLLERR | POLLHUP))
        close_stdin(e);
}

/* Collect exited main children.  waitid(WNOWAIT) first, so the zombie still
 * pins the pid/sid while we SIGKILL the rest of its session; only then reap. */
static void reap(void)
{
    struct signalfd_siginfo si;
    while (read(sig_fd, &si, sizeof si) > 0)
        ;
    for (struct exec *e = execs; e; e = e->next) {
        siginfo_t info;
        if (e->exited)
            continue;
        info.si_pid = 0;
        if (waitid(P_PID, (id_t)e->pid, &info, WEXITED | WNOHANG | WNOWAIT) < 0 ||
            info.si_pid == 0)
            continue;
        e->exited = 1;   /* before the sweep: it spares the live ones only */
        if (!e->builtin)
            end_exec(e);   /* everything it started dies with it */
        while (wait4(e->pid, &e->status, 0, &e->ru) < 0 && errno == EINTR)
            ;
        e->end_us = now_us();
        close_stdin(e);
    }
    /* Children no execution owns: the zygote, and (we are a subreaper once
     * there is one) orphans of every run.  One whose pid an execution still
     * waits for ends the loop: the next SIGCHLD round takes it first. */
    for (;;) {
        siginfo_t info;
        info.si_pid = 0;
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 || info.si_pid == 0)
            break;
        int owned = 0;
        for (struct exec *e = execs; e; e = e->next)
            owned |= !e->exited && e->pid == info.si_pid;
        if (owned)
            break;
        while (waitpid(info.si_pid, NULL, 0) < 0 && errno == EINTR)
            ;
        zygote_reaped(info.si_pid);
    }
}

static void check_timeouts(int64_t now)
{
    for (struct exec *e = execs; e; e = e->next) {
        if (e->exited || e->killed || !e->deadline_us || now < e->deadline_us)
            continue;
        e->timed_out = 1;
        kill_exec(e);
    }
}

/* Send EXIT and forget the execution. */
static void finish(struct exec *e)
{
    char msg[160];
    int code = -1, sig = 0;

    close_fd(&e->out[0]);
    close_fd(&e->out[1]);
    close_fd(&e->ctl_fd);
    close_stdin(e);
    save_close(e);
    if (WIFEXITED(e->status))
        code = WEXITSTATUS(e->status);
    else if (WIFSIGNALED(e->status))
        sig = WTERMSIG(e->status);
    int n = snprintf(msg, sizeof msg, "%d %d %d %d %lld %ld %d", code, sig, e->timed_out,
                     e->truncated, (long long)(e->end_us - e->start_us), e->ru.ru_maxrss, e->memory_killed);
    send_frame(CUBICLE_FRAME_EXIT, e->id, msg, (size_t)n);
    free(e);
}

/* An execution is done once its child is reaped and its output and control
 * pipes reached EOF, or the drain grace period ran out (something escaped
 * the process group with setsid and holds the pipes open). */
static void finish_completed(int64_t now)
{
    for (struct exec **pp = &execs; *pp;) {
        struct exec *e = *pp;
        int drained = e->out[0] < 0 && e->out[1] < 0 && e->ctl_fd < 0;
        if (e->exited && (drained || now >= e->end_us + DRAIN_US)) {
            *pp = e->next;
            finish(e);
        } else {
            pp = &e->next;
        }
    }
}

/* Is a program running?  The memory limit is watched only then. */
static int programs_run(void)
{
    for (struct exec *e = execs; e; e = e->next)
        if (!e->exited && !e->builtin)
            return 1;
    return 0;
}

/* Holds the programs to their memory limit (memory.h); the execution whose
 * process it killed says so in its EXIT. */
static void check_memory(int64_t now)
{
    if (!programs_run() || now < memory_due_us(now))
        return;
    pid_t session = memory_check(now);
    for (struct exec *e = execs; session > 0 && e; e = e->next)
        if (e->pid == session)
            e->memory_killed = 1;
}

/* Milliseconds until the nearest deadline, or -1 for none. */
static int poll_timeout(int64_t now)
{
    int64_t next = -1;
    for (struct exec *e = execs; e; e = e->next) {
        int64_t t = e->exited ? e->end_us + DRAIN_US
                  : (e->deadline_us && !e->killed) ? e->deadline_us : -1;
        if (t >= 0 && (next < 0 || t < next))
            next = t;
    }
    int64_t check = programs_run() ? memory_due_us(now) : -1;
    if (check >= 0 && (next < 0 || check < next))
        next = check;
    if (next < 0)
        return -1;
    int64_t ms = (next - now + 999) / 1000;
    return ms < 0 ? 0 : ms > INT_MAX ? INT_MAX : (int)ms;
}

/* ---- main loop ------------------------------------------------------- */

enum { W_STDOUT, W_STDERR, W_CONTROL, W_STDIN, W_COUNT };   /* poll slots per exec */
struct slot { struct exec *e; int which; };   /* e NULL: a stream's socket (streams.h) */

/* Add e's open pipes to the poll set.  Stdin only asks for POLLOUT while
 * bytes are queued (a session's idle stdin would otherwise spin the loop);
 * POLLERR still reports a child that closed its end. */
static size_t add_exec_fds(struct exec *e, struct pollfd *pfd, struct slot *slot, size_t n)
{
    int fds[W_COUNT] = { e->out[0], e->out[1], e->ctl_fd, e->in_fd };

    for (int w = 0; w < W_COUNT; w++) {
        if (fds[w] < 0)
            continue;
        short ev = w != W_STDIN ? POLLIN : e->in_off < e->in_len ? POLLOUT : 0;
        slot[n] = (struct slot){ e, w };
        pfd[n++] = (struct pollfd){ fds[w], ev, 0 };
    }
    return n;
}

/* One exec's pipe polled ready. */
static void service(struct slot s, short revents)
{
    if (s.which == W_STDIN)
        service_stdin(s.e, revents);
    else if (s.which == W_CONTROL)
        pump_control(s.e);
    else
        pump_output(s.e, s.which);
}

static void setup(void)
{
    /* children get fds 0-2 via dup2, so ours must exist to keep pipes >= 3 */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            exit(1);
    signal(SIGPIPE, SIG_IGN);   /* a dead reader must be an EPIPE, not death */
    signal(SIGXFSZ, SIG_IGN);   /* a saved output past RLIMIT_FSIZE is EFBIG, not death */

    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    sig_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sig_fd < 0)
        die(1, "signalfd failed");
}

int main(int argc, char **argv)
{
    struct pollfd *pfd = NULL;
    struct slot *slot = NULL;
    struct stream **owner = NULL;   /* the stream polled at each slot, for streams */
    size_t cap = 0;

    if (argc >= 2 && strcmp(argv[1], "--proxy") == 0)
        return proxy_main(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "--relay") == 0)
        return relay_main(argc - 2, argv + 2);
    uint64_t memory_limit = 0;
    int sandbox = argc >= 2 && strcmp(argv[1], "--sandbox") == 0, usage = argc > 1 && !sandbox;
    /* --dial-only: no attach stream reaches the server (a Swarm task on another
     * node): the hello and every frame go over the connection home, or nowhere. */
    int dial_only = 0;
    for (int i = 2; sandbox && i < argc && !usage; i += 2) {
        if (strcmp(argv[i], "--dial-only") == 0) {
            dial_only = 1;
            i--;
        } else if (i + 1 >= argc)
            usage = 1;
        else if (strcmp(argv[i], "--memory-limit") == 0)
            usage = wire_parse_u64(argv[i + 1], &memory_limit) != 0;
        else
            usage = 1;
    }
    if (usage) {
        fprintf(stderr, "usage: cubicle-agent [--sandbox [--memory-limit BYTES] [--dial-only] | --proxy PORT [ALLOW ...] | --relay PORT TARGET]\n");
        return 2;
    }
    sweep_enabled = sandbox && getuid() != 0;
    setup();
    paths_init();
    streams_init(send_frame, exec_id_taken);
    if (sweep_enabled) {
        reset_snapshot();
        memory_init(memory_limit);
    }
    /* Before any program runs: a mounted socket, else the server's TLS endpoint. */
    int channel = sweep_enabled && !dial_only ? connect_channel() : -1;
    if (sweep_enabled && channel < 0)
        channel = dial_home();
    if (dial_only) {
        if (channel < 0)
            die(1, "--dial-only: the connection home failed");
        server_in = server_out = channel;
    }
    /* Dialing only, the hello is the first frame home: it names no other channel. */
    const char *hello = channel >= 0 && !dial_only ? CUBICLE_HELLO_CHANNEL : CUBICLE_HELLO;
    send_frame(CUBICLE_FRAME_HELLO, 0, hello, strlen(hello));
    if (channel >= 0)
        server_in = server_out = channel;

    for (;;) {
        size_t n = 0, need = 2 + streams_count();
        for (struct exec *e = execs; e; e = e->next)
            need += W_COUNT;
        if (need > cap) {
            pfd = realloc(pfd, need * sizeof *pfd);
            slot = realloc(slot, need * sizeof *slot);
            owner = realloc(owner, need * sizeof *owner);
            if (!pfd || !slot || !owner)
                die(1, "out of memory for poll set");
            cap = need;
        }
        pfd[n++] = (struct pollfd){ server_in, POLLIN, 0 };
        pfd[n++] = (struct pollfd){ sig_fd, POLLIN, 0 };
        for (struct exec *e = execs; e; e = e->next)
            n = add_exec_fds(e, pfd, slot, n);
        size_t first_stream = n;
        n = streams_add_fds(pfd, owner, n);
        for (size_t i = first_stream; i < n; i++)
            slot[i] = (struct slot){ NULL, 0 };

        if (poll(pfd, n, poll_timeout(now_us())) < 0) {
            if (errno == EINTR)
                continue;
            die(1, "poll failed");
        }
        /* Child I/O first; nothing below removes executions until
         * finish_completed, so the slots stay valid.  A pipe closed earlier
         * in this pass (a control read drains the output pipes) is skipped
         * by the handlers, which check for -1. */
        for (size_t i = 2; i < n; i++)
            if (pfd[i].revents && slot[i].e)
                service(slot[i], pfd[i].revents);
            else if (pfd[i].revents)
                streams_service(owner[i], pfd[i].revents);
        if (pfd[1].revents)
            reap();
        if (pfd[0].revents)
            read_input();
        int64_t now = now_us();
        check_timeouts(now);
        check_memory(now);
        finish_completed(now);
        streams_reap();
    }
}
