/*
 * The wire protocol between the cubicle server and its in-sandbox agent: the
 * one definition.  The agent (C) and the server (C++, sandbox/agent_protocol)
 * include this header; the Python tests read their constants from it
 * (tests/agent_wire.py parses the lines below, so keep their shape).
 *
 * Frame (both directions): u32 BE payload length, u8 type, u32 BE exec id,
 * then the payload.
 *
 * RUN and OPEN payloads: NUL-terminated decimal timeout_ms, max_output_bytes
 * (per stream, 0 = none), cwd ("" = the agent's), argc, argc argv strings,
 * envc, envc KEY=VALUE strings; the rest of the payload is stdin.
 * EXIT payload: "exit_code signal timed_out truncated duration_us max_rss_kb
 * memory_limit" (decimal, space-separated; exit_code -1 when killed by a
 * signal; the last 1 when a process of the execution was killed at the
 * memory limit (memory.h)).
 *
 * RESET (empty payload; only honoured by `cubicle-agent --sandbox` running as
 * the container's main process, never as root): every execution and every
 * other process of the sandbox uid is killed (an EXIT frame follows for each
 * execution), every writable place is brought back to what it held when the
 * agent started, System V IPC objects are removed, then the container is
 * verified.  CLEAN answers with the same id: an empty payload when nothing is
 * left, else a human-readable list of what is (the server then removes the
 * container instead of reusing it).
 *
 * RESTORE and DROP (server -> agent; checkpoint.h) act on a parked copy of
 * an OPEN execution's interpreter; RESTORE's only answer is an ERROR when it
 * is refused (else the interpreter's next CONTROL line), DROP has none.
 *
 * Streams (port previews, streams.h): CONNECT (payload: a decimal port) asks
 * the agent to connect to 127.0.0.1:PORT -- the sandbox's own loopback, the
 * only address it ever dials -- as stream <id> (ids shared with executions).
 * CONNECTED answers, or ERROR when nothing listens.  Then DATA carries bytes
 * both ways, SHUT with an empty payload ends one direction (a half-close;
 * the stream is over once both directions ended) and SHUT with a non-empty
 * payload (why) aborts it: both sides forget it, nothing answers.  Each side
 * may have at most CUBICLE_STREAM_WINDOW bytes of DATA unacknowledged by the
 * other; WINDOW (payload: decimal bytes) hands credit back once they left
 * for their destination, so neither side buffers more than a window per
 * stream and a big download never crowds out other executions' frames.
 */
#ifndef CUBICLE_AGENT_PROTOCOL_H
#define CUBICLE_AGENT_PROTOCOL_H

#define CUBICLE_FRAME_HEADER_SIZE 9
/* HELLO's payload.  The server may bind-mount a socket it listens on at
 * CUBICLE_AGENT_CHANNEL; an agent that connects to it says so with the second
 * form, and every later frame, both ways, goes over that socket instead of
 * the attach stream (which Docker relays through two more processes). */
#define CUBICLE_HELLO "cubicle-agent 1"
#define CUBICLE_HELLO_CHANNEL "cubicle-agent 1 channel"
#define CUBICLE_AGENT_CHANNEL "/run/cubicle/agent.sock"
/* Or the agent dials home (--agent-channel tcp): this variable of its
 * environment holds "ADDRESS:PORT PIN TOKEN" -- the server's TLS endpoint (an
 * IPv6 address in brackets), the lowercase hex SHA-256 of its certificate's
 * public key (DER SubjectPublicKeyInfo), which the agent requires, and a
 * one-time token of CUBICLE_DIAL_TOKEN_SIZE hex digits, which the agent sends,
 * then a newline, as the first bytes inside TLS.  The server answers
 * CUBICLE_DIAL_ACCEPTED (one byte) when it took the token, and closes the
 * connection on anything else; the agent waits for that byte before it says
 * "channel" in its hello.  The agent removes the variable before any program
 * runs (an empty value: no dialing); the server accepts each token once. */
#define CUBICLE_AGENT_DIAL "CUBICLE_AGENT_DIAL"
#define CUBICLE_DIAL_TOKEN_SIZE 32
#define CUBICLE_DIAL_ACCEPTED '+'
/* A RUN (or FORK) whose argv[0] is one of these runs the agent's own code in
 * the forked child instead of exec'ing a program: the changed-files listing
 * (changed.h), a recursive removal (remove.h) or search_files (search.h), */
#define CUBICLE_BUILTIN_CHANGED_FILES "cubicle-agent:changed-files"
#define CUBICLE_BUILTIN_REMOVE "cubicle-agent:remove"
#define CUBICLE_BUILTIN_SEARCH "cubicle-agent:search"
/* ... and the two halves of edit_file (textfile.h) */
#define CUBICLE_BUILTIN_READ_FILE "cubicle-agent:read-file"
#define CUBICLE_BUILTIN_REPLACE_FILE "cubicle-agent:replace-file"
/* Every execution's environment carries CUBICLE_RUN_MARKER=<exec id>, which
 * every process it starts inherits: how the agent tells what belongs to a
 * live execution once it left its session (agent.c, "ending processes").
 * The zygote starts with the value CUBICLE_RUN_MARKER_ZYGOTE (id 0, nobody's:
 * exec id 0 is reserved) and each run it forks overwrites those digits in
 * place with its own id, zero-padded: /proc/PID/environ shows the
 * environment a process's exec made, not what it set later. */
#define CUBICLE_RUN_MARKER "CUBICLE_RUN"
#define CUBICLE_RUN_MARKER_ZYGOTE "0000000000"
/* Flow control of streams (see above): DATA in flight per stream and direction. */
#define CUBICLE_STREAM_WINDOW (1u << 20)
/* The most one stream DATA frame carries, and the relays' read size. */
#define CUBICLE_STREAM_CHUNK (64u * 1024)
/* the largest payload either side accepts */
#define CUBICLE_FRAME_MAX_PAYLOAD (64u << 20)

/* X(NAME, cxx_name, value): every frame type, with its spelling in C
 * (CUBICLE_FRAME_NAME) and in C++ (FrameType::cxx_name, where stdout and
 * stderr are macros).  The first group goes server -> agent (DATA, SHUT and
 * WINDOW go both ways), the second agent -> server. */
#define CUBICLE_FRAME_TYPES(X)                                                   \
    X(RUN, run, 0x01)         /* start a program; payload ends with stdin */     \
    X(KILL, kill, 0x02)       /* kill an execution's process group */            \
    X(PING, ping, 0x03)       /* answered by PONG with the same payload */       \
    X(STDIN, stdin, 0x04)     /* input for an OPEN process; empty = EOF */       \
    X(OPEN, open, 0x05)       /* RUN with open stdin and fd 3 for control */     \
    X(SIGNAL, signal, 0x06)   /* payload: a signal for the execution's group */  \
    X(START, start, 0x07)     /* RUN with stdin kept open for STDIN frames */    \
    X(SAVE, save, 0x08)       /* "CAP\0DIR": copy the next RUN's output to DIR */ \
    X(RESET, reset, 0x09)     /* end every process, wipe, verify: see below */   \
    X(ZYGOTE, zygote, 0x0A)   /* RUN payload: (re)start the zygote (zygote.h)  */ \
    X(FORK, fork, 0x0B)       /* a RUN the zygote forks when it can, else a RUN */ \
    X(CONNECT, connect, 0x0C) /* open stream <id> to 127.0.0.1:PORT (see above) */ \
    X(DATA, data, 0x0D)       /* a stream's bytes; both ways */                  \
    X(SHUT, shut, 0x0E)       /* "" = end of one direction, else abort; both ways */ \
    X(WINDOW, window, 0x0F)   /* credit for more DATA, decimal; both ways */     \
    X(HELLO, hello, 0x10)     /* first frame: "cubicle-agent VERSION" */         \
    X(STDOUT, stdout_, 0x11)                                                     \
    X(STDERR, stderr_, 0x12)                                                     \
    X(EXIT, exit, 0x13)       /* an execution ended; after all its output */     \
    X(ERROR, error, 0x14)     /* a request failed; the payload says why */       \
    X(PONG, pong, 0x15)                                                          \
    X(CONTROL, control, 0x16) /* bytes an OPEN process wrote to fd 3 */      \
    X(CLEAN, clean, 0x17)     /* RESET's answer: "" = pristine, else what is left */ \
    X(CONNECTED, connected, 0x18) /* CONNECT's answer: the stream is open */     \
    X(RESTORE, restore, 0x19) /* "EXEC PID": a parked checkpoint goes live (checkpoint.h) */ \
    X(DROP, drop, 0x1A)       /* "EXEC PID": a parked checkpoint is killed (checkpoint.h) */

#define CUBICLE_FRAME_ENUM_(name, cxx_name, value) CUBICLE_FRAME_##name = value,
enum cubicle_frame_type { CUBICLE_FRAME_TYPES(CUBICLE_FRAME_ENUM_) };
#undef CUBICLE_FRAME_ENUM_

#endif
