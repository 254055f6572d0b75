/*
 * An object cache, as Go's sync.Pool: get and put with no lock on the fast
 * path, idle objects destroyed over time.
 *
 * Shards are per thread, not per P: a P's slot can be shared for a while by
 * two Ms (sysmon lends a spare P in the slot of one held too long), while a
 * thread runs one coroutine at a time and none switches inside get or put.
 * Every thread that uses a cache gets a small slot number (shared by all
 * caches, reused after the thread exits); a cache keeps one shard of up to
 * SHARD_CAP objects per slot, a shared overflow stack, and a victim stack.
 *
 * Release over time, as Go's two-GC victim cache: every `period` a sweep
 * (a runtime timer) destroys the victims, then moves the shared stack and
 * every shard's objects to the victims. An object not taken back within
 * two sweeps is destroyed; get takes from the victims before constructing.
 *
 * The sweep takes objects out of shards whose owners run without a lock:
 * an asymmetric Dekker handshake. An owner marks its shard busy, then
 * looks at the cache's `sweeping` flag and takes the locked slow path if it
 * is up. The sweeper raises the flag, then makes every thread of the
 * process execute a full barrier (membarrier(2), private expedited), then
 * skips the shards it finds busy. Either the owner sees the flag, or the
 * sweeper sees the mark. Where membarrier is unavailable (old kernels,
 * qemu-user) and under TSan, the owner's side uses seq_cst instead.
 */
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef __NR_membarrier
#include <linux/membarrier.h>
#endif

#define SHARD_CAP 16
#define MAX_SLOTS 4096
#define CACHE_PERIOD_NS (2 * 1000 * 1000 * 1000LL)

/* Under TSan, the coroutines that run one after another on a thread would
 * look like racing on a shard's objects: a put releases the object and a
 * get acquires it, which is what passing it through the cache means. */
#ifdef CO_TSAN
#define OBJ_REL(o) __tsan_release(o)
#define OBJ_ACQ(o) __tsan_acquire(o)
#else
#define OBJ_REL(o) ((void)0)
#define OBJ_ACQ(o) ((void)0)
#endif

/* ---- thread slots ----------------------------------------------------------- */
static co__lock_t slot_lock;               /* protects slot_used */
static unsigned char slot_used[MAX_SLOTS]; /* under slot_lock */
static pthread_key_t slot_key;
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;
static __thread int my_slot __attribute__((tls_model("initial-exec"))); /* slot + 1; 0: none yet; -1: none to be had */
/* 1: membarrier works; 2: the owner's side uses seq_cst. Set once. */
static int mb_mode;

static void slot_release(void *p) {
    int s = (int)(intptr_t)p - 1;
    co__lock(&slot_lock);
    slot_used[s] = 0;
    co__unlock(&slot_lock);
}
static void slot_init(void) {
    if (pthread_key_create(&slot_key, slot_release) != 0) co__fatal("co_cache: pthread_key_create failed");
    int mode = 2;
#if defined(__NR_membarrier) && !defined(CO_TSAN)
    if (syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0) mode = 1;
#endif
    __atomic_store_n(&mb_mode, mode, __ATOMIC_RELEASE);
}

/* The caller's slot, or -1 (more than MAX_SLOTS threads: the slow path). */
CO_THREAD_STATE static int slot_get_slow(void) {
    int s = my_slot;
    if (s > 0) return s - 1;
    if (s < 0) return -1;
    pthread_once(&slot_once, slot_init);
    co__lock(&slot_lock);
    for (s = 0; s < MAX_SLOTS && slot_used[s]; s++) {
    }
    if (s < MAX_SLOTS) slot_used[s] = 1;
    co__unlock(&slot_lock);
    if (s == MAX_SLOTS) {
        my_slot = -1;
        return -1;
    }
    pthread_setspecific(slot_key, (void *)(intptr_t)(s + 1));
    my_slot = s + 1;
    return s;
}
#ifdef CO_TSAN
#define slot_get slot_get_slow /* its thread-local read must stay uninstrumented */
#else
static inline int slot_get(void) {
    int s = my_slot;
    return __builtin_expect(s > 0, 1) ? s - 1 : slot_get_slow();
}
#endif

/* ---- the cache ---------------------------------------------------------------- */
typedef struct shard {
    /* 1 while the owner is in its section (its thread only writes it;
     * exit is a release store, read acquire by the sweep) */
    int busy;
    /* owner only, or the sweep when not busy (relaxed atomics: the
     * handshake orders them) */
    int n;
    void *obj[SHARD_CAP];
} shard_t;

typedef struct shardv {
    int n;          /* immutable */
    struct shardv *next_old; /* the cache's replaced vectors; under lock */
    shard_t *s[];   /* written under the cache lock before publication, or NULL */
} shardv_t;

typedef struct stack {
    void **v;
    size_t n, cap;
} stack_t_;

struct co_cache {
    void *(*new_fn)(void *arg);
    void (*free_fn)(void *obj, void *arg);
    void *arg;
    int64_t period;
    shardv_t *shards; /* replaced under lock (release), read acquire */
    int sweeping;     /* 1 during a sweep's handshake; under lock, read by owners (see above) */
    int armed;        /* 1 while the sweep timer runs and the runtime is held; under lock, read relaxed */
    int closing;      /* 0 -> 1 by co_cache_free (seq_cst), read by the timer callback */
    co__lock_t lock;  /* protects shards' publication, shared, victim, armed, old, and
                       * owners' shards on their slow path */
    stack_t_ shared, victim;
    shardv_t *old;    /* replaced shard vectors, freed with the cache; under lock */
    uint64_t sweeps;  /* sweeps begun; written under lock, read relaxed by tests */
    co__timer_t tm;
};

static bool stack_push(stack_t_ *st, void *o) {
    if (st->n == st->cap) {
        size_t nc = st->cap ? st->cap * 2 : 64;
        void **nv = realloc(st->v, nc * sizeof *nv);
        if (!nv) return false;
        st->v = nv, st->cap = nc;
    }
    st->v[st->n++] = o;
    return true;
}

int co_cache_new(co_cache_t **out, void *(*new_fn)(void *arg), void (*free_fn)(void *obj, void *arg), void *arg) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    co_cache_t *c = calloc(1, sizeof *c);
    if (!c) return CO_ENOMEM;
    c->new_fn = new_fn;
    c->free_fn = free_fn;
    c->arg = arg;
    c->period = CACHE_PERIOD_NS;
    c->tm.slot = -1;
    *out = c;
    return 0;
}

static void destroy(co_cache_t *c, void *o) {
    if (c->free_fn) c->free_fn(o, c->arg);
}

/* The owner's section: false if a sweep is under way (take the lock). */
static inline bool shard_enter(shard_t *s, co_cache_t *c, int mode) {
    if (mode == 1) {
        __atomic_store_n(&s->busy, 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the sweep's membarrier makes it a full fence */
        /* acquire: a 0 stored by a sweep that ended meanwhile (its
         * release store) brings that sweep's writes of n and obj; the
         * membarrier orders only a sweep's start against busy */
        if (__builtin_expect(!__atomic_load_n(&c->sweeping, __ATOMIC_ACQUIRE), 1)) return true;
    } else {
        __atomic_store_n(&s->busy, 1, __ATOMIC_SEQ_CST); /* pairs with the sweep's seq_cst */
        if (__builtin_expect(!__atomic_load_n(&c->sweeping, __ATOMIC_SEQ_CST), 1)) return true;
    }
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE);
    return false;
}
static inline void shard_exit(shard_t *s) { __atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE); }

static inline shard_t *my_shard(co_cache_t *c, int sl) {
    shardv_t *v = __atomic_load_n(&c->shards, __ATOMIC_ACQUIRE);
    return (v && sl >= 0 && sl < v->n) ? __atomic_load_n(&v->s[sl], __ATOMIC_ACQUIRE) : NULL;
}

/* Under lock: the shard of slot sl, made if missing (NULL without memory). */
static shard_t *shard_make(co_cache_t *c, int sl) {
    if (sl < 0) return NULL;
    shardv_t *v = c->shards;
    if (v && sl < v->n && v->s[sl]) return v->s[sl];
    shard_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (!v || sl >= v->n) {
        int n = v ? v->n : 0;
        int nn = n ? n : 4;
        while (nn <= sl) nn *= 2;
        shardv_t *nv = calloc(1, sizeof *nv + (size_t)nn * sizeof(shard_t *));
        if (!nv) {
            free(s);
            return NULL;
        }
        nv->n = nn;
        if (v) memcpy(nv->s, v->s, (size_t)n * sizeof(shard_t *));
        nv->s[sl] = s;
        if (v) { /* readers may still hold it: freed with the cache */
            v->next_old = c->old;
            c->old = v;
        }
        __atomic_store_n(&c->shards, nv, __ATOMIC_RELEASE);
        return s;
    }
    __atomic_store_n(&v->s[sl], s, __ATOMIC_RELEASE);
    return s;
}

static void cache_sweep(void *arg);

/* Under lock: keep a sweep coming while objects are cached; the runtime
 * is held meanwhile (so only when it is up). */
static bool arm_locked(co_cache_t *c) {
    if (c->armed || __atomic_load_n(&c->closing, __ATOMIC_RELAXED)) return false;
    if (!co__rt_hold_if_up(CO__HOLD_CACHE)) return false;
    __atomic_store_n(&c->armed, 1, __ATOMIC_RELAXED); /* read relaxed by put's fast path */
    c->tm.fn = cache_sweep;
    c->tm.arg = c;
    c->tm.period = c->period;
    co__timer_add(&c->tm, co__time_add(co_now(), c->period));
    return true;
}

static void *get_slow(co_cache_t *c, int sl) {
    void *o = NULL;
    co__lock(&c->lock);
    shard_t *s = shard_make(c, sl);
    if (c->shared.n)
        o = c->shared.v[--c->shared.n];
    else if (c->victim.n)
        o = c->victim.v[--c->victim.n];
    /* refill our shard from the shared stack while we hold the lock (the
     * sweep, the only other writer of a shard, takes it too) */
    if (o && s) {
        int n = __atomic_load_n(&s->n, __ATOMIC_RELAXED);
        while (n < SHARD_CAP / 2 && c->shared.n) __atomic_store_n(&s->obj[n++], c->shared.v[--c->shared.n], __ATOMIC_RELAXED);
        __atomic_store_n(&s->n, n, __ATOMIC_RELAXED);
    }
    co__unlock(&c->lock);
    if (o) {
        OBJ_ACQ(o);
        return o;
    }
    return c->new_fn ? c->new_fn(c->arg) : NULL;
}

void *co_cache_get(co_cache_t *c) {
    if (!c) co__fatal("co_cache_get(NULL): NULL cache");
    int sl = slot_get();
    shard_t *s = my_shard(c, sl);
    if (__builtin_expect(s != NULL, 1) && shard_enter(s, c, __atomic_load_n(&mb_mode, __ATOMIC_RELAXED))) {
        int n = __atomic_load_n(&s->n, __ATOMIC_RELAXED);
        if (n > 0) {
            void *o = __atomic_load_n(&s->obj[n - 1], __ATOMIC_RELAXED);
            __atomic_store_n(&s->n, n - 1, __ATOMIC_RELAXED);
            shard_exit(s);
            OBJ_ACQ(o);
            return o;
        }
        shard_exit(s);
    }
    return get_slow(c, sl);
}

static void put_slow(co_cache_t *c, int sl, void *o) {
    bool ok;
    co__lock(&c->lock);
    shard_t *s = shard_make(c, sl);
    int n = s ? __atomic_load_n(&s->n, __ATOMIC_RELAXED) : SHARD_CAP;
    if (n < SHARD_CAP) {
        __atomic_store_n(&s->obj[n], o, __ATOMIC_RELAXED);
        __atomic_store_n(&s->n, n + 1, __ATOMIC_RELAXED);
        ok = true;
    } else {
        ok = stack_push(&c->shared, o);
    }
    arm_locked(c);
    co__unlock(&c->lock);
    if (!ok) destroy(c, o); /* no memory to keep it: it is simply not cached */
}

void co_cache_put(co_cache_t *c, void *obj) {
    if (!c) co__fatal("co_cache_put(NULL, %p): NULL cache", obj);
    if (!obj) return;
    OBJ_REL(obj);
    int sl = slot_get();
    shard_t *s = my_shard(c, sl);
    if (__builtin_expect(s != NULL, 1) && shard_enter(s, c, __atomic_load_n(&mb_mode, __ATOMIC_RELAXED))) {
        int n = __atomic_load_n(&s->n, __ATOMIC_RELAXED);
        /* armed read inside the section: a sweep that ended meanwhile
         * cleared it before its release of sweeping, which shard_enter
         * acquired; one still to come sees this shard */
        if (n < SHARD_CAP && __builtin_expect(__atomic_load_n(&c->armed, __ATOMIC_RELAXED), 1)) {
            __atomic_store_n(&s->obj[n], obj, __ATOMIC_RELAXED);
            __atomic_store_n(&s->n, n + 1, __ATOMIC_RELAXED);
            shard_exit(s);
            return;
        }
        shard_exit(s);
    }
    put_slow(c, sl, obj);
}

static void cache_sweep(void *arg) {
    co_cache_t *c = arg;
    /* seq_cst: pairs with the store in co_cache_free */
    if (__atomic_load_n(&c->closing, __ATOMIC_SEQ_CST)) return;
    co__lock(&c->lock);
    __atomic_store_n(&c->sweeps, c->sweeps + 1, __ATOMIC_RELAXED);
    stack_t_ dead = c->victim;
    c->victim = c->shared;
    memset(&c->shared, 0, sizeof c->shared);
    /* the handshake: raise the flag, make it seen, skip busy shards */
    __atomic_store_n(&c->sweeping, 1, __ATOMIC_SEQ_CST);
#ifdef __NR_membarrier
    if (__atomic_load_n(&mb_mode, __ATOMIC_RELAXED) == 1) syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
    bool left = false;
    shardv_t *v = c->shards;
    for (int i = 0; v && i < v->n; i++) {
        shard_t *s = v->s[i];
        if (!s) continue;
        if (__atomic_load_n(&s->busy, __ATOMIC_SEQ_CST)) { /* its owner is in: next time */
            left = true;
            continue;
        }
        int n = __atomic_load_n(&s->n, __ATOMIC_ACQUIRE);
        int k = 0;
        while (k < n && stack_push(&c->victim, __atomic_load_n(&s->obj[k], __ATOMIC_RELAXED))) k++;
        /* without memory for the victim stack, what is left stays */
        for (int j = k; j < n; j++) __atomic_store_n(&s->obj[j - k], __atomic_load_n(&s->obj[j], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        __atomic_store_n(&s->n, n - k, __ATOMIC_RELAXED);
        if (n - k) left = true;
    }
    bool keep = left || c->victim.n;
    /* before the flag goes down (release): an owner that sees the flag
     * down sees armed cleared and arms again (put_slow) */
    if (!keep) __atomic_store_n(&c->armed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c->sweeping, 0, __ATOMIC_RELEASE);
    if (keep)
        co__timer_add(&c->tm, co__time_add(co_now(), c->period));
    co__unlock(&c->lock);
    for (size_t i = 0; i < dead.n; i++) {
        OBJ_ACQ(dead.v[i]);
        destroy(c, dead.v[i]);
    }
    free(dead.v);
    if (!keep) co__rt_unhold(CO__HOLD_CACHE);
}

void co_cache_free(co_cache_t *c) {
    if (!c) return;
    __atomic_store_n(&c->closing, 1, __ATOMIC_SEQ_CST);
    /* as co_ticker_stop: remove until neither pending nor running */
    for (;;) {
        co__timer_del(&c->tm);
        if (__atomic_load_n(&c->tm.state, __ATOMIC_ACQUIRE) == CO__TM_IDLE) break;
    }
    shardv_t *v = c->shards;
    for (int i = 0; v && i < v->n; i++) {
        shard_t *s = v->s[i];
        if (!s) continue;
        for (int j = 0; j < s->n; j++) destroy(c, s->obj[j]);
        free(s);
    }
    free(v);
    for (shardv_t *o = c->old, *nx; o; o = nx) {
        nx = o->next_old;
        free(o);
    }
    for (size_t i = 0; i < c->shared.n; i++) destroy(c, c->shared.v[i]);
    for (size_t i = 0; i < c->victim.n; i++) destroy(c, c->victim.v[i]);
    free(c->shared.v);
    free(c->victim.v);
    if (c->armed) co__rt_unhold(CO__HOLD_CACHE);
    free(c);
}

/* Sweeps begun since the cache was made (for tests). */
uint64_t co__test_cache_sweeps(co_cache_t *c) { return __atomic_load_n(&c->sweeps, __ATOMIC_RELAXED); }

/* The sweep period (tests and tuning); 0 restores the default. Takes effect
 * from the next sweep. */
int co_cache_set_period(co_cache_t *c, int64_t period_ns) {
    if (!c || period_ns < 0) return CO_EINVAL;
    co__lock(&c->lock);
    c->period = period_ns ? period_ns : CACHE_PERIOD_NS;
    co__unlock(&c->lock);
    return 0;
}
