#!/bin/sh
# Writes an assembler file that embeds the agent binary ($1) into cubicle ($2).
set -eu
cat > "$2" <<ASM
    .section .rodata
    .balign 16
    .global cubicle_agent_start
    .global cubicle_agent_end
cubicle_agent_start:
    .incbin "$(realpath "$1")"
cubicle_agent_end:
    .section .note.GNU-stack,"",@progbits
ASM
