/* Checkpoints of a live interpreter: see checkpoint.h. */
#include "checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "paths.h"
#include "procfs.h"
#include "protocol.h"

const char *checkpoint_parse(const char *payload, size_t len, uint32_t *exec_id, pid_t *pid)
{
    char buf[48], *end;

    if (len == 0 || len >= sizeof buf || memchr(payload, 0, len))
        return "expected \"EXEC PID\"";
    memcpy(buf, payload, len);
    buf[len] = '\0';
    unsigned long id = strtoul(buf, &end, 10);
    if (end == buf || *end != ' ' || id == 0 || id > UINT32_MAX)
        return "expected \"EXEC PID\"";
    char *rest = end + 1;
    long p = strtol(rest, &end, 10);
    if (end == rest || *end || p <= 1)
        return "expected \"EXEC PID\"";
    *exec_id = (uint32_t)id;
    *pid = (pid_t)p;
    return NULL;
}

/* Is the environment the process started with marked with exactly this
 * execution (protocol.h, CUBICLE_RUN_MARKER)?  The last such entry counts,
 * as it does for the agent's marker. */
static int marked_with(pid_t pid, uint32_t exec_id)
{
    char path[64];
    static char env[256 * 1024];
    ssize_t n, got = 0;

    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    int fd = open_at(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    while (got < (ssize_t)sizeof env - 1 && (n = read(fd, env + got, sizeof env - 1 - (size_t)got)) > 0)
        got += n;
    close(fd);
    env[got] = '\0';
    int found = 0;
    for (ssize_t i = 0; i < got; i += (ssize_t)strlen(env + i) + 1) {
        const char *value = env + i + sizeof CUBICLE_RUN_MARKER;   /* past "CUBICLE_RUN=" */
        char *end;
        if (strncmp(env + i, CUBICLE_RUN_MARKER "=", sizeof CUBICLE_RUN_MARKER) != 0 || !*value)
            continue;
        unsigned long id = strtoul(value, &end, 10);   /* a zygote's runs are zero-padded */
        found = !*end && id == exec_id;
    }
    return found;
}

const char *checkpoint_refusal(pid_t pid, uint32_t exec_id)
{
    char buf[1024];
    pid_t sid;
    char state;
    unsigned long uid;

    if (proc_session(pid, &sid, &state) < 0 || state == 'Z' || state == 'X')
        return "its parked copy is gone (killed at the sandbox's memory limit, or by a program)";
    if (read_proc(pid, "status", buf, sizeof buf) < 0)
        return "its parked copy is gone";
    char *u = strstr(buf, "\nUid:");
    if (!u || sscanf(u + 5, "%lu", &uid) != 1 || uid != (unsigned long)getuid())
        return "that process is not a parked copy of this interpreter";
    if (sid != pid || !marked_with(pid, exec_id))
        return "that process is not a parked copy of this interpreter";
    if (state != 'T')
        return "its parked copy is not stopped (a program woke it): it cannot be trusted";
    return NULL;
}

void checkpoint_wake(pid_t pid)
{
    kill(pid, SIGUSR2);   /* blocked in the copy: pending until it looks */
    kill(pid, SIGCONT);
}
