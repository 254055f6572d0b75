/*
 * Context switch for x86-64, System V ABI, ELF, GNU as.
 *
 * void co__jump(void **save_sp, void *to_sp)
 *
 * Saves what the SysV ABI makes callee-saved (rbx, rbp, r12-r15) plus the
 * MXCSR and x87 control words, on the current stack, in this frame:
 *
 *   sp+0   padding   (keeps the frame a multiple of 16 with the return addr)
 *   sp+8   MXCSR (4 bytes) | x87 FPU control word (2 bytes)
 *   sp+16  r15
 *   sp+24  r14
 *   sp+32  r13
 *   sp+40  r12      <- a fresh context keeps its G here
 *   sp+48  rbx
 *   sp+56  rbp
 *   sp+64  return address  <- co__trampoline for a fresh context
 *
 * Everything else is caller-saved and already spilled by the C caller
 * (none is needed as scratch here).
 * CET: both entry points start with endbr64 (IBT). The shadow stack (SHSTK)
 * is not supported: a switch changes stacks without telling the CPU.
 */
    .text
/* The body both entry points share; `tail` is what ends it: ret for
 * co__jump, a jump to co__switch_post for co__jump_post. */
    .macro  CO_JUMP_BODY tail:vararg
    endbr64
    pushq   %rbp
    pushq   %rbx
    pushq   %r12
    pushq   %r13
    pushq   %r14
    pushq   %r15
    subq    $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw  12(%rsp)
    movq    %rsp, (%rdi)
    movq    %rsi, %rsp
    /* Load the other side's control words unconditionally. Comparing
     * first (to skip equal ones) must read back what stmxcsr just stored,
     * and that load waits for the microcoded store: a yield round trip
     * took 11.7 ns with the compare and 10.3 ns without (median of 15,
     * alternating; docs/hacking.md). */
    ldmxcsr 8(%rsp)
    fldcw   12(%rsp)
    addq    $16, %rsp
    popq    %r15
    popq    %r14
    popq    %r13
    popq    %r12
    popq    %rbx
    popq    %rbp
    \tail
    .endm

    .globl  co__jump
    .hidden co__jump
    .type   co__jump, @function
    .p2align 4
co__jump:
    .cfi_startproc
    CO_JUMP_BODY ret
    .cfi_endproc
    .size   co__jump, .-co__jump

/*
 * void co__jump_post(void **save_sp, void *to_sp)
 * void co__jump_yslot(void **save_sp, void *to_sp)
 *
 * co__jump, but the other side's first act is a call of the switcher's
 * post-switch work, co__switch_post() or co__post_yslot() (sched.c),
 * entered by a jump with rsp at the other side's return address, as if
 * that side had called it: its ret returns there. The C caller runs
 * nothing after the switch, so a switch in tail position (co_yield's fast
 * path) is a jump, and its function keeps no registers of its own across
 * it: the callee-saved ones are saved once, here, not also in the
 * caller's prologue; and the post-switch work is picked by the entry
 * point, not looked up. Every switch of a build goes through these two,
 * or every one through co__jump (a context saved by either must be
 * resumed by a switch that runs the post-switch work): sanitizer builds
 * use co__jump and do it in C, after their fiber calls.
 */
    .globl  co__jump_post
    .hidden co__jump_post
    .type   co__jump_post, @function
    .p2align 4
co__jump_post:
    .cfi_startproc
    CO_JUMP_BODY jmp co__switch_post
    .cfi_endproc
    .size   co__jump_post, .-co__jump_post

    .globl  co__jump_yslot
    .hidden co__jump_yslot
    .type   co__jump_yslot, @function
    .p2align 4
co__jump_yslot:
    .cfi_startproc
    CO_JUMP_BODY jmp co__post_yslot
    .cfi_endproc
    .size   co__jump_yslot, .-co__jump_yslot

/* First code of every coroutine: rsp is 16-byte aligned here, r12 = G. */
    .globl  co__trampoline
    .hidden co__trampoline
    .type   co__trampoline, @function
    .p2align 4
co__trampoline:
    .cfi_startproc
    .cfi_undefined rip
    endbr64
    movq    %r12, %rdi
    call    co__g_entry
    ud2
    .cfi_endproc
    .size   co__trampoline, .-co__trampoline

/*
 * void co__fresh_start(void *top, struct co_g *g, uint64_t fpenv)
 *
 * Start g on the stack whose (16-byte aligned) top is `top`, abandoning
 * the caller's frames, which may lie on that very stack: an exiting
 * coroutine hands its stack to a coroutine that never ran (sched.c's
 * goexit). Nothing is saved. Loads the FP control words from fpenv (MXCSR
 * in bits 0-31, x87 control word in bits 32-47, as co__ctx_make) and calls
 * co__g_entry(g) as co__trampoline does, with rsp = top before the call.
 */
    .globl  co__fresh_start
    .hidden co__fresh_start
    .type   co__fresh_start, @function
    .p2align 4
co__fresh_start:
    .cfi_startproc
    .cfi_undefined rip
    endbr64
    movq    %rdi, %rsp
    pushq   %rdx
    ldmxcsr (%rsp)
    fldcw   4(%rsp)
    addq    $8, %rsp
    movq    %rsi, %rdi
    xorl    %ebp, %ebp
    call    co__g_entry
    ud2
    .cfi_endproc
    .size   co__fresh_start, .-co__fresh_start

    .section .note.GNU-stack,"",%progbits
