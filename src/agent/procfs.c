/* Reading a process's files in /proc: see procfs.h. */
#include "procfs.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "paths.h"

/* Reads /proc/PID/NAME into buf as a string; -1 if the process is gone. */
int read_proc(pid_t pid, const char *name, char *buf, size_t size)
{
    char path[64];
    ssize_t n;
    int fd;

    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    if ((fd = open_at(path, O_RDONLY | O_CLOEXEC, 0)) < 0)
        return -1;
    n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return 0;
}

/* Session and state of a process from /proc; -1 if it is gone. */
int proc_session(pid_t pid, pid_t *sid, char *state)
{
    char buf[1024];

    if (read_proc(pid, "stat", buf, sizeof buf) < 0)
        return -1;
    /* "pid (comm) state ppid pgrp session ...": comm may hold anything, so
     * parse from its last closing parenthesis */
    char *p = strrchr(buf, ')');
    int ppid, pgrp, session;
    if (!p || sscanf(p + 1, " %c %d %d %d", state, &ppid, &pgrp, &session) != 4)
        return -1;
    *sid = session;
    return 0;
}
