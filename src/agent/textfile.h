/*
 * Reading and replacing one workspace file, built into the agent for
 * edit_file: a read, an edit on the server and an atomic write cost two forks
 * of the agent instead of two shells and the half-dozen programs they start.
 * Both run in a forked child of the agent, as the sandbox user, in the
 * workspace, with a RUN's pipes, timeout and output cap.
 */
#ifndef CUBICLE_AGENT_TEXTFILE_H
#define CUBICLE_AGENT_TEXTFILE_H

/* argv: CUBICLE_BUILTIN_READ_FILE PATH MAX_BYTES [FIRST LAST].  PATH must be
 * a regular file inside the working directory (links followed only while
 * they stay inside it) of at most MAX_BYTES.  Writes its stamp ("SIZE MTIME
 * INODE", what replace-file checks: the modification time is as coarse as
 * the kernel's clock tick, and a replaced file is a new inode), a space, its
 * permission bits in octal, a newline, then its bytes.  With FIRST and LAST
 * (1-based, inclusive), a file of any size: lines FIRST to LAST, at most
 * MAX_BYTES of them, then a NUL, the stamp, the permission bits and the
 * file's line count (a last line without a newline counts).  Returns 2 with
 * the reason on stderr when it cannot. */
int read_file_main(int argc, char **argv);

/* argv: CUBICLE_BUILTIN_REPLACE_FILE PATH STAMP.  Writes standard input to
 * PATH atomically (a temporary file in its directory, renamed over it) with
 * PATH's permission bits, provided PATH's stamp is still STAMP: a file changed
 * since it was read is left alone.  Returns 2 with the reason on stderr when
 * it cannot. */
int replace_file_main(int argc, char **argv);

#endif
