/*
 * search_files, built into the agent: a regular-expression search over a tree
 * of the workspace, without a shell or a grep in the image.  It runs in a
 * forked child of the agent, as the sandbox user, with a RUN's pipes,
 * timeout and output cap.  Symbolic links are never followed (a path through
 * one is refused), .git directories, binary files (a NUL in the first 8 KiB)
 * and what .gitignore files exclude are skipped; files are visited in name
 * order, so the same tree gives the same results.
 */
#ifndef CUBICLE_AGENT_SEARCH_H
#define CUBICLE_AGENT_SEARCH_H

/* argv: CUBICLE_BUILTIN_SEARCH WORKSPACE PATH PATTERN FLAGS CONTEXT MAX BUDGET GLOBS
 *   WORKSPACE  absolute; what the reported paths are relative to
 *   PATH       a file or directory relative to WORKSPACE ("." for all of it)
 *   FLAGS      letters: 'i' ignore case, 'F' the pattern is a fixed string
 *   CONTEXT    lines before and after each match (0..10)
 *   MAX        matches written; later ones are only counted
 *   BUDGET     bytes of records written, roughly; later matches only counted
 *   GLOBS      comma-separated file-name globs ("" = every file); one with a
 *              '/' matches the path below WORKSPACE or below PATH
 * stdout, every field ending in a NUL (a NUL inside a line is written as
 * U+FFFD; lines are cut at CUBICLE_SEARCH_LINE_BYTES):
 *   "m" PATH LINE COLUMN TEXT NBEFORE BEFORE... NAFTER AFTER...   per match
 *   "s" COUNT FILES_SEARCHED CUT                                  at the end
 * COUNT counts every matching line; CUT is 1 when matches were left out.
 * Exit 2 with a message on stderr for a bad pattern or path. */
int search_main(int argc, char **argv);

#define CUBICLE_SEARCH_LINE_BYTES 500

#endif
