/*
 * Context switch for AArch64, AAPCS64, ELF, GNU as.
 *
 * void co__jump(void **save_sp, void *to_sp)
 *
 * Saves what AAPCS64 makes callee-saved: x19-x28, x29 (fp), x30 (lr), the
 * low 64 bits of v8-v15 (d8-d15), plus FPCR, in this 176-byte frame:
 *
 *   sp+0    x19 x20      sp+96   d8  d9
 *   sp+16   x21 x22      sp+112  d10 d11
 *   sp+32   x23 x24      sp+128  d12 d13
 *   sp+48   x25 x26      sp+144  d14 d15
 *   sp+64   x27 x28      sp+160  fpcr, padding
 *   sp+80   x29 x30
 *
 * A fresh context has x30 = co__trampoline and x19 = its G.
 * BTI: entry points start with `bti c` (hint 34, a no-op without BTI).
 */
    .text
/* The body both entry points share; `tail` ends it: ret for co__jump, a
 * branch to co__switch_post for co__jump_post (see the x86-64 file). */
    .macro  CO_JUMP_BODY tail:vararg
    hint    #34
    sub     sp, sp, #176
    stp     x19, x20, [sp, #0]
    stp     x21, x22, [sp, #16]
    stp     x23, x24, [sp, #32]
    stp     x25, x26, [sp, #48]
    stp     x27, x28, [sp, #64]
    stp     x29, x30, [sp, #80]
    stp     d8,  d9,  [sp, #96]
    stp     d10, d11, [sp, #112]
    stp     d12, d13, [sp, #128]
    stp     d14, d15, [sp, #144]
    mrs     x9, fpcr
    str     x9, [sp, #160]
    mov     x9, sp
    str     x9, [x0]
    mov     sp, x1
    ldp     x19, x20, [sp, #0]
    ldp     x21, x22, [sp, #16]
    ldp     x23, x24, [sp, #32]
    ldp     x25, x26, [sp, #48]
    ldp     x27, x28, [sp, #64]
    ldp     x29, x30, [sp, #80]
    ldp     d8,  d9,  [sp, #96]
    ldp     d10, d11, [sp, #112]
    ldp     d12, d13, [sp, #128]
    ldp     d14, d15, [sp, #144]
    ldr     x9, [sp, #160]
    msr     fpcr, x9
    add     sp, sp, #176
    \tail
    .endm

    .globl  co__jump
    .hidden co__jump
    .type   co__jump, %function
    .p2align 4
co__jump:
    CO_JUMP_BODY ret
    .size   co__jump, .-co__jump

/* co__jump, but the other side starts with the switcher's post-switch
 * work, co__switch_post() or co__post_yslot(), returning through x30 to
 * where that side was (see co__jump_post in the x86-64 file). */
    .globl  co__jump_post
    .hidden co__jump_post
    .type   co__jump_post, %function
    .p2align 4
co__jump_post:
    CO_JUMP_BODY b co__switch_post
    .size   co__jump_post, .-co__jump_post

    .globl  co__jump_yslot
    .hidden co__jump_yslot
    .type   co__jump_yslot, %function
    .p2align 4
co__jump_yslot:
    CO_JUMP_BODY b co__post_yslot
    .size   co__jump_yslot, .-co__jump_yslot

    .globl  co__trampoline
    .hidden co__trampoline
    .type   co__trampoline, %function
    .p2align 4
co__trampoline:
    .cfi_startproc
    .cfi_undefined x30  /* the outermost frame: debuggers stop unwinding here */
    hint    #34
    mov     x0, x19
    mov     x29, #0
    bl      co__g_entry
    brk     #0
    .cfi_endproc
    .size   co__trampoline, .-co__trampoline

/*
 * void co__fresh_start(void *top, struct co_g *g, uint64_t fpenv)
 *
 * Start g on the stack whose (16-byte aligned) top is `top`, abandoning
 * the caller's frames (which may lie on that very stack): see the x86-64
 * file. Loads FPCR from fpenv and calls co__g_entry(g) as co__trampoline.
 */
    .globl  co__fresh_start
    .hidden co__fresh_start
    .type   co__fresh_start, %function
    .p2align 4
co__fresh_start:
    .cfi_startproc
    .cfi_undefined x30  /* as co__trampoline: nothing above this frame */
    hint    #34
    mov     sp, x0
    msr     fpcr, x2
    mov     x0, x1
    mov     x29, #0
    bl      co__g_entry
    brk     #0
    .cfi_endproc
    .size   co__fresh_start, .-co__fresh_start

    .section .note.GNU-stack,"",%progbits
