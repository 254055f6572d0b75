# colony-gdb.py: gdb commands that see colony's coroutines.
#
#   (gdb) source /usr/local/share/colony/colony-gdb.py     (or tools/ here)
#   (gdb) info colony               Ps, Ms and what each M runs
#   (gdb) info coroutines [MAX]     every live coroutine (or the first MAX):
#                                   id, name, state, what it waits on, its
#                                   entry function; then a count by state
#   (gdb) coroutine 12 bt           run a gdb command "inside" coroutine 12:
#   (gdb) coroutine worker bt full    with its saved registers (by id, by
#   (gdb) coroutine all bt            name, or every live one)
#
# How it works. Every coroutine record (co_g_t) is on the list
# co__sched.allg. A coroutine that is not running keeps its registers where
# its last switch saved them (g->ctx.sp: the frame documented at the top of
# src/arch/jump_*.S, or a ucontext_t in the portable build). `coroutine N
# CMD` selects a thread, points its registers at that frame, runs CMD (gdb
# unwinds from there with the program's own CFI) and puts the registers
# back. A running coroutine is shown on the thread of the M that runs it.
#
# Needs: gdb 11 or later with Python (tested with gdb 13), and the types
# of colony's records, i.e. debug information (the default RelWithDebInfo
# build has it). Works on a live process (started under gdb
# or attached) and on a core file, where gdb cannot set registers: there
# the coroutine's frames are grafted onto the thread's instead (see "core
# files" below) and its backtrace starts at frame #1.
#
# The numbers below mirror src/runtime.h (CO_G_*, CO_P_*); the wait reasons
# are read from the program (co_dump's table), with src/internal.h's
# CO__WR_* names as the fallback; tests/test_gdb.c checks them.

import itertools
import struct

import gdb
from gdb.unwinder import Unwinder, register_unwinder

G_STATUS = ["idle", "runnable", "running", "waiting", "dead"]
P_STATUS = ["idle", "running", "syscall", "dead"]
WAIT_REASONS = ["", "sleep", "chan send", "chan receive", "select", "sync.Mutex.Lock",
                "sync.RWMutex", "sync.Cond.Wait", "sync.WaitGroup.Wait", "semacquire",
                "sync.Once", "pool", "IO wait", "co_main", "group"]
G_IDLE, G_RUNNABLE, G_RUNNING, G_WAITING, G_DEAD = range(5)


def _sched():
    try:
        return gdb.parse_and_eval("co__sched")
    except gdb.error:
        raise gdb.GdbError("colony: no co__sched here (not a colony program, or no debug info)")


def _read_u64(addr):
    mem = gdb.selected_inferior().read_memory(addr, 8)
    return struct.unpack("<Q", bytes(mem))[0]


def _symbol(addr):
    """The name of the function holding a code address ('0x...' if unknown)."""
    if not addr:
        return "-"
    try:
        block = gdb.block_for_pc(addr)
        while block is not None and block.function is None:
            block = block.superblock
        if block is not None:
            return block.function.print_name
    except (RuntimeError, gdb.error):
        pass
    out = gdb.execute("info symbol 0x%x" % addr, to_string=True).strip()
    if out.startswith("No symbol"):
        return "0x%x" % addr
    return out.split(" in section")[0]


def _all_g():
    """Every coroutine record that holds a live coroutine."""
    g = _sched()["allg"]
    while int(g) != 0:
        st = int(g["status"])
        if st not in (G_IDLE, G_DEAD):
            yield g
        g = g["alllink_next"]


def _all_m():
    m = _sched()["allm"]
    while int(m) != 0:
        yield m
        m = m["alllink"]


def _g_name(g):
    try:
        return g["name"].string()
    except (gdb.error, UnicodeDecodeError):
        return ""


def _wait_reasons():
    """The program's own names (co_dump's table in src/debug.c), else ours."""
    try:
        sym = gdb.lookup_static_symbol("wait_reasons")
        if sym is not None:
            tab = sym.value()
            n = tab.type.range()[1] + 1
            return [tab[i].string() if int(tab[i]) else "" for i in range(n)]
    except (AttributeError, RuntimeError, gdb.error):
        pass
    return WAIT_REASONS


def _g_state(g, reasons=None):
    reasons = reasons or _wait_reasons()
    st = int(g["status"])
    s = G_STATUS[st] if st < len(G_STATUS) else str(st)
    wr = int(g["wait_reason"])
    if st == G_WAITING and 0 < wr < len(reasons):
        s += ", " + reasons[wr]
    return s


def _running_on(g):
    """The M running g, or None."""
    for m in _all_m():
        if int(m["curg"]) == int(g):
            return m
    return None


def _thread_of(m):
    """The gdb thread of M m (matched by its pthread_t)."""
    want = int(m["thread"])
    for th in gdb.selected_inferior().threads():
        try:
            if int.from_bytes(th.handle(), "little") == want:
                return th
        except (AttributeError, RuntimeError, gdb.error):
            continue  # (a remote target, qemu's say, may not know handles)
    return None


def _not_started(regs):
    """Whether a coroutine with these saved registers (None: no context;
    see _run_in) never ran: its context starts at the trampoline
    (src/arch/ctx_make.c)."""
    if regs is None:
        return True
    pcs = [v for r, v in regs if r in ("rip", "pc")]
    return _symbol(pcs[0]) in ("co__trampoline", "uc_entry")


def _saved_regs(g):
    """The registers g's last switch saved: a list of (register, value)."""
    ctx = g["ctx"]
    arch = gdb.newest_frame().architecture().name()
    try:
        uc = ctx["uc"]  # the portable build: swapcontext saved a ucontext_t
    except gdb.error:
        uc = None
    if uc is not None:
        if "x86-64" not in arch:
            raise gdb.GdbError("colony: the ucontext build is supported on x86-64 only")
        gr = uc["uc_mcontext"]["gregs"]
        # glibc's REG_* indices into gregs
        idx = {"r12": 4, "r13": 5, "r14": 6, "r15": 7, "rbp": 10, "rbx": 11,
               "rsp": 15, "rip": 16}
        return [(r, int(gr[i]) & 0xFFFFFFFFFFFFFFFF) for r, i in idx.items()]
    sp = int(ctx["sp"])
    if sp == 0:
        return None
    if "x86-64" in arch:
        # jump_x86_64_sysv_elf_gas.S: sp+16 r15 .. sp+56 rbp, sp+64 return address
        regs = [("r15", 16), ("r14", 24), ("r13", 32), ("r12", 40), ("rbx", 48),
                ("rbp", 56)]
        out = [(r, _read_u64(sp + off)) for r, off in regs]
        out.append(("rip", _read_u64(sp + 64)))
        out.append(("rsp", sp + 72))
        return out
    if "aarch64" in arch:
        # jump_arm64_aapcs_elf_gas.S: x19..x28 at sp+0..72, x29 x30 at sp+80, 176 bytes
        out = [("x%d" % (19 + i), _read_u64(sp + 8 * i)) for i in range(10)]
        out.append(("x29", _read_u64(sp + 80)))
        lr = _read_u64(sp + 88)
        out.append(("x30", lr))
        out.append(("pc", lr))
        out.append(("sp", sp + 176))
        return out
    raise gdb.GdbError("colony: unknown architecture %s" % arch)


def _where(g):
    """Entry function of g."""
    return _symbol(int(g["fn"]))


class InfoColony(gdb.Command):
    """Show colony's scheduler: each P (state, queue) and each M (thread, what it runs)."""

    def __init__(self):
        super(InfoColony, self).__init__("info colony", gdb.COMMAND_STATUS)

    def invoke(self, arg, from_tty):
        s = _sched()
        n = int(s["nprocs"])
        if int(s["allp"]) == 0:
            print("colony: runtime not started")
            return
        print("procs=%d idleprocs=%d threads=%d spinning=%d global runqueue=%d" %
              (n, int(s["npidle"]), int(s["mcount"]), int(s["nmspinning"]),
               int(s["runqsize"])))
        for i in range(n):
            p = s["allp"][i]
            st = int(p["status"])
            qlen = (int(p["runqtail"]) - int(p["runqhead"])) & 0xFFFFFFFF
            extra = []
            if int(p["runnext"]):
                extra.append("runnext=%d" % int(p["runnext"]["id"]))
            if int(p["yieldg"]):
                extra.append("yieldslot=%d" % int(p["yieldg"]["id"]))
            if int(p["obn"]):
                extra.append("batch=%d" % int(p["obn"]))
            m = p["m"]
            own = " M%d" % int(m["id"]) if st != 0 and int(m) else ""
            print("  P%d %s%s runqueue=%d %s" % (i, P_STATUS[st] if st < 4 else st, own, qlen,
                                                " ".join(extra)))
        for m in _all_m():
            th = _thread_of(m)
            g = m["curg"]
            what = "coroutine %d" % int(g["id"]) if int(g) else "scheduler"
            p = m["p"]
            pn = "-"
            if int(p):
                # a P being retired: sysmon put a spare in its place in allp
                pn = "%d%s" % (int(p["id"]), " (retiring)" if int(p["retire"]) else "")
            print("  M%d%s P%s %s%s" % (int(m["id"]), " (thread %d)" % th.num if th else "",
                                        pn, what, " spinning" if bool(m["spinning"]) else ""))


class InfoCoroutines(gdb.Command):
    """List colony's live coroutines: id, name, state, wait reason, entry function.
Usage: info coroutines [MAX]   (at most MAX lines; a count by state ends the list)
A '*' marks the one running on the selected thread."""

    def __init__(self):
        super(InfoCoroutines, self).__init__("info coroutines", gdb.COMMAND_STATUS)

    def invoke(self, arg, from_tty):
        limit = None
        if arg.strip():
            try:
                limit = int(arg.strip(), 0)
            except ValueError:
                raise gdb.GdbError("usage: info coroutines [MAX]")
        cur = gdb.selected_thread()
        reasons = _wait_reasons()
        n = 0
        by_state = {}
        for g in _all_g():
            n += 1
            st = int(g["status"])
            by_state[st] = by_state.get(st, 0) + 1
            if limit is not None and n > limit:
                continue
            m = _running_on(g) if st == G_RUNNING else None
            th = _thread_of(m) if m is not None else None
            mark = "*" if th is not None and cur is not None and th.num == cur.num else " "
            name = _g_name(g)
            on = " on M%d (thread %d)" % (int(m["id"]), th.num) if th is not None else ""
            print("%s coroutine %d%s [%s]%s fn=%s" % (mark, int(g["id"]),
                                                 " '%s'" % name if name else "",
                                                 _g_state(g, reasons), on, _where(g)))
        if limit is not None and n > limit:
            print("  ... %d more" % (n - limit))
        print("%d live coroutine%s: %s" % (
            n, "" if n == 1 else "s",
            ", ".join("%d %s" % (c, G_STATUS[st] if st < len(G_STATUS) else st)
                      for st, c in sorted(by_state.items())) or "none"))


def _find(spec):
    """The coroutines `spec` names: an id, 'all', or a name."""
    gs = list(_all_g())
    if spec == "all":
        return gs
    try:
        want = int(spec, 0)
        found = [g for g in gs if int(g["id"]) == want]
    except ValueError:
        found = [g for g in gs if _g_name(g) == spec]
    if not found:
        raise gdb.GdbError("colony: no live coroutine %s" % spec)
    return found


def _run_in(g, cmd):
    """Run gdb command cmd with g's registers in place."""
    if int(g["status"]) == G_RUNNING:
        m = _running_on(g)
        th = _thread_of(m) if m is not None else None
        if th is None:
            print("(running, but on no thread gdb knows)")
            return
        old = gdb.selected_thread()
        th.switch()
        try:
            gdb.execute(cmd)
        finally:
            if old is not None:
                old.switch()
        return
    # A coroutine that never ran has no stack yet (a default-size one is
    # attached when it first runs), so no context either.
    regs = None if int(g["stack"]["map"]) == 0 else _saved_regs(g)
    if _not_started(regs):
        print("(not started yet: it will run %s)" % _where(g))
        return
    level = gdb.selected_frame().level()  # the user's frame, selected again after
    frame = gdb.newest_frame()
    frame.select()
    saved = [(r, int(frame.read_register(r)) & 0xFFFFFFFFFFFFFFFF) for r, _ in regs]
    try:
        for r, v in regs:
            gdb.execute("set $%s = 0x%x" % (r, v), to_string=True)
    except gdb.error:
        for r, v in saved:
            try:
                gdb.execute("set $%s = 0x%x" % (r, v), to_string=True)
            except gdb.error:
                pass
        _run_unwound(regs, cmd)  # a core file: no registers to set
        return
    try:
        gdb.execute(cmd)
    finally:
        for r, v in saved:
            gdb.execute("set $%s = 0x%x" % (r, v), to_string=True)
        _select_level(level)


def _select_level(level):
    f = gdb.newest_frame()
    while f is not None and f.level() < level:
        f = f.older()
    (f or gdb.newest_frame()).select()


# ---- core files -------------------------------------------------------------
# gdb cannot set a core file's registers, so there the coroutine's frames are
# grafted on instead: while a command runs, an unwinder says that the caller
# of the selected thread's frame 0 is the coroutine's saved context (gdb
# unwinds the rest from there), and a frame filter hides that frame 0 from
# backtraces. Frame numbers then start at 1.

class _FrameId(object):
    def __init__(self, sp, pc):
        self.sp = sp
        self.pc = pc


class _GraftUnwinder(Unwinder):
    def __init__(self):
        super(_GraftUnwinder, self).__init__("colony-coroutine")
        self.regs = None  # (register, value) pairs while a command runs
        self.thread = None

    def __call__(self, pending_frame):
        if self.regs is None or pending_frame.level() != 0:
            return None
        if gdb.selected_thread() is None or gdb.selected_thread().num != self.thread:
            return None
        arch = pending_frame.architecture().name()
        spr, pcr = ("rsp", "rip") if "x86-64" in arch else ("sp", "pc")
        # Frame 0's id claims the lowest stack address there is: gdb stops a
        # backtrace at a caller that looks "inner" to its callee (a lower
        # stack address, i.e. a corrupt stack), and the coroutine's stack
        # may well lie below the thread's.
        info = pending_frame.create_unwind_info(
            _FrameId(gdb.Value(0).cast(pending_frame.read_register(spr).type),
                     pending_frame.read_register(pcr)))
        for r, v in self.regs:
            info.add_saved_register(r, gdb.Value(v).cast(pending_frame.read_register(r).type))
        return info


class _GraftFilter(object):
    def __init__(self):
        self.name = "colony-coroutine"
        self.priority = 100
        self.enabled = True
        self.active = False

    def filter(self, frames):
        if not self.active:
            return frames
        return itertools.islice(frames, 1, None)


_graft = _GraftUnwinder()
_graft_filter = _GraftFilter()
register_unwinder(None, _graft, replace=True)
gdb.frame_filters[_graft_filter.name] = _graft_filter


def _run_unwound(regs, cmd):
    _graft.regs = regs
    _graft.thread = gdb.selected_thread().num
    _graft_filter.active = True
    gdb.invalidate_cached_frames()
    try:
        gdb.execute(cmd)
    finally:
        _graft.regs = None
        _graft_filter.active = False
        gdb.invalidate_cached_frames()


class CoroutineCmd(gdb.Command):
    """Run a gdb command inside a colony coroutine.
Usage: coroutine ID|NAME|all COMMAND
Example: coroutine 12 bt    coroutine worker bt full    coroutine all bt"""

    def __init__(self):
        super(CoroutineCmd, self).__init__("coroutine", gdb.COMMAND_STACK)

    def invoke(self, arg, from_tty):
        parts = arg.split(None, 1)
        if len(parts) < 2:
            raise gdb.GdbError("usage: coroutine ID|NAME|all COMMAND")
        for g in _find(parts[0]):
            name = _g_name(g)
            print("coroutine %d%s [%s]:" % (int(g["id"]), " '%s'" % name if name else "",
                                           _g_state(g)))
            _run_in(g, parts[1])


InfoColony()
InfoCoroutines()
CoroutineCmd()
