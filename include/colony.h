/*
 * colony — Go's concurrency for C11.
 *
 * Coroutines scheduled M:N over OS threads by Go's G-P-M work-stealing
 * scheduler, channels and select, Go's sync primitives, context, timers,
 * a netpoller, and an ants-style coroutine pool.
 *
 * Conventions (see docs/):
 *  - Functions return 0 (or a count) on success and a negative value on
 *    failure: one of the CO_E* codes below or -errno. errno is never the
 *    channel for errors: a coroutine may resume on another thread.
 *  - Time is int64_t nanoseconds on the co_now() monotonic clock. Every
 *    blocking call takes an absolute deadline: CO_FOREVER waits forever, any
 *    deadline already past (0 included) means "try once, do not block"
 *    (co_sleep_until excepted: CO_EINVAL for CO_FOREVER or a negative time).
 *  - Every blocking call works from a coroutine (it parks the coroutine) and
 *    from a plain OS thread (it blocks the thread).
 *  - The first call of anything starts the runtime with defaults.
 *  - NULL, for an object or a required pointer argument:
 *      a call that returns int (or ssize_t) answers CO_EINVAL and does
 *        nothing (co_mutex_trylock, co_chan_send, co_ctx_err, ...);
 *      a call that cannot answer an error -- a void one, or
 *        co_sem_try_acquire, whose false means only "not now" -- prints
 *        "colony: fatal: <call>(NULL...): ..." and aborts, as Go's nil
 *        pointer dereference panics (co_mutex_lock/unlock, the
 *        co_waitgroup_* calls but wait_until, co_cond_signal, co_ctx_cancel,
 *        co_group_limit, co_sched_stats, co_timer_stop, ...);
 *      a free or destroy of NULL does nothing, as free(NULL) (co_chan_free,
 *        co_ticker_stop, co_timer_free, co_ctx_free, co_group_free);
 *      a getter that returns a value gives the one documented for NULL
 *        (co_chan_len/cap: 0; co_ticker_chan, co_timer_chan, co_ctx_done,
 *        co_ctx_value, co_group_ctx: NULL; co_ctx_deadline: false).
 *    Optional pointers are documented as such: co_init's cfg and
 *    co_go_with's attr (NULL: the defaults), co_group_new's parent (the
 *    background), co_dump's out (stderr), a receive's elem (the value is
 *    dropped), a select case's ch (never ready), co_recover's value.
 */
#ifndef COLONY_H
#define COLONY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CO_EXTERN __attribute__((visibility("default")))
#else
#define CO_EXTERN
#endif
/* C11's _Noreturn is no C++ keyword: the header is usable from C++ too */
#if defined(__GNUC__)
#define CO_NORETURN __attribute__((noreturn))
#elif defined(__cplusplus)
#define CO_NORETURN
#else
#define CO_NORETURN _Noreturn
#endif

#define COLONY_VERSION_MAJOR 0
#define COLONY_VERSION_MINOR 1
#define COLONY_VERSION_PATCH 0

/* ---- errors ------------------------------------------------------------ */
/* Distinct negative codes, chosen far below any -errno value. */
#define CO_ECLOSED (-10001)   /* channel or pool closed                     */
#define CO_EOVERLOAD (-10002) /* pool full (nonblocking / too many waiters) */
#define CO_ETIMEDOUT (-10003) /* deadline passed                            */
#define CO_EINVAL (-10004)    /* invalid argument                           */
#define CO_ENOMEM (-10005)    /* out of memory / address space              */
#define CO_ECANCELED (-10006) /* context canceled                           */
#define CO_EBUSY (-10007)     /* in use: co_shutdown with something alive, a trylock of a held lock */
#define CO_EDEADLK (-10008)   /* operation would deadlock (submit to own full pool) */
#define CO_EPERM (-10009)     /* not allowed from this context; a send or close on a receive-only channel */
#define CO_ETLS (-10020)       /* TLS: handshake or record failure (bad peer, garbage, alert) */
#define CO_ETLSVERIFY (-10021) /* TLS: the peer's certificate failed verification */
#define CO_ENOTFOUND (-10010) /* no such host: the name has no address (NXDOMAIN, no data) */
#define CO_EADDR (-10011)     /* malformed address, or none of the network's family */
#define CO_ENETUNKNOWN (-10012) /* unknown network (not "tcp", "udp4", "unix", ...) */
#define CO_EDNS (-10013)      /* the name servers failed (refused, server failure, bad answer) */
CO_EXTERN const char *co_strerror(int err);

/* ---- time -------------------------------------------------------------- */
#define CO_FOREVER ((int64_t)-1)
CO_EXTERN int64_t co_now(void);                /* monotonic nanoseconds */
CO_EXTERN int64_t co_deadline_after(int64_t ns); /* co_now()+ns; CO_FOREVER if ns < 0 or if the sum overflows */
/* Durations in nanoseconds (Go's time.Nanosecond ... time.Hour). */
#define CO_NANOSECOND ((int64_t)1)
#define CO_MICROSECOND ((int64_t)1000 * CO_NANOSECOND)
#define CO_MILLISECOND ((int64_t)1000 * CO_MICROSECOND)
#define CO_SECOND ((int64_t)1000 * CO_MILLISECOND)
#define CO_MINUTE ((int64_t)60 * CO_SECOND)
#define CO_HOUR ((int64_t)60 * CO_MINUTE)

/* ---- runtime ----------------------------------------------------------- */
typedef struct co_config {
    int procs;         /* number of Ps; 0: $COLONY_PROCS or the CPU count */
    size_t stack_size; /* default coroutine stack; 0: library default (256 KiB) */
} co_config_t;

typedef struct co_attr {
    size_t stack_size; /* 0: the runtime default */
    const char *name;  /* shown by co_dump and in crash reports; may be NULL; copied */
} co_attr_t;

#define CO_STACK_MIN ((size_t)16 * 1024)
#define CO_STACK_MAX ((size_t)1024 * 1024 * 1024)
/* Stack compaction (docs/stacks.md): the calling coroutine promises (on =
 * 1) that nothing outside it reads or writes its stack while it is parked:
 * no other coroutine or thread holds a pointer to one of its locals then
 * (a buffer another coroutine fills while this one waits on a waitgroup
 * breaks the promise; one it receives into with co_chan_recv keeps it).
 * Then, once it has been parked longer than $COLONY_COMPACT_MS (default
 * 1000) in co_chan_send or co_chan_recv with CO_FOREVER, or in an I/O call
 * (co_read, co_write, co_accept...) with no deadline, the live part of its
 * stack is moved to the heap and its pages are released; it is copied back
 * before the coroutine runs again (a page fault and a copy of ~0.5 KiB on
 * that wake-up). Other waits are never compacted. on = 0 withdraws it. 0,
 * CO_EINVAL (on not 0 or 1) or CO_EPERM (not called from a coroutine, or
 * called to opt in from a pool task: its worker runs other tasks after it,
 * which made no such promise). A new coroutine starts without it. */
CO_EXTERN int co_stack_compactable(int on);
/* How many coroutines have their stack compacted now: from any thread, a
 * count that may be stale by the time it returns; 0 before co_init. */
CO_EXTERN int64_t co_stack_compacted(void);

CO_EXTERN int co_init(const co_config_t *cfg);
CO_EXTERN int co_shutdown(void);
CO_EXTERN int co_main(int (*fn)(void *arg), void *arg);
/* Start fn(arg) as a coroutine: 0, CO_EINVAL or CO_ENOMEM. From a
 * coroutine whose P already has 256 coroutines queued (or the global queue
 * 256 per P), it yields once before returning (spawn back-pressure,
 * docs/runtime.md). */
CO_EXTERN int co_go(void (*fn)(void *arg), void *arg);
CO_EXTERN int co_go_with(const co_attr_t *attr, void (*fn)(void *arg), void *arg);
/* Let other coroutines run, then continue (Go's runtime.Gosched); on a
 * plain thread, sched_yield(). co_yield is the same call; it is hidden
 * from C++20 and later, where co_yield is a keyword. */
CO_EXTERN void co_gosched(void);
#if !defined(__cplusplus) || __cplusplus < 202002L
CO_EXTERN void co_yield(void);
#endif
CO_EXTERN int co_sleep(int64_t ns);
CO_EXTERN int co_sleep_until(int64_t deadline);
CO_EXTERN uint64_t co_id(void);
CO_EXTERN int co_procs(void);
CO_EXTERN int co_count(void);

/* ---- sync (embeddable; zero-initialised == *_INIT) --------------------- */
typedef struct co_mutex { uint64_t _opaque[4]; } co_mutex_t;
typedef struct co_rwmutex { uint64_t _opaque[16]; } co_rwmutex_t;
typedef struct co_cond { uint64_t _opaque[4]; } co_cond_t;
typedef struct co_waitgroup { uint64_t _opaque[4]; } co_waitgroup_t;
typedef struct co_once { uint64_t _opaque[6]; } co_once_t;
typedef struct co_sem { uint64_t _opaque[6]; } co_sem_t;
typedef struct co_spinlock { uint32_t _opaque; } co_spinlock_t;
#define CO_MUTEX_INIT {{0}}
#define CO_RWMUTEX_INIT {{0}}
#define CO_COND_INIT {{0}}
#define CO_WAITGROUP_INIT {{0}}
#define CO_ONCE_INIT {{0}}
#define CO_SPINLOCK_INIT {0}

CO_EXTERN void co_mutex_lock(co_mutex_t *m);
CO_EXTERN int co_mutex_trylock(co_mutex_t *m);
CO_EXTERN void co_mutex_unlock(co_mutex_t *m);
CO_EXTERN void co_rwmutex_rlock(co_rwmutex_t *rw);
CO_EXTERN void co_rwmutex_runlock(co_rwmutex_t *rw);
CO_EXTERN void co_rwmutex_lock(co_rwmutex_t *rw);
CO_EXTERN void co_rwmutex_unlock(co_rwmutex_t *rw);
/* Go's TryLock / TryRLock: 0 with the lock taken, CO_EBUSY if it would
 * wait (a writer holds or waits, or, for trylock, any reader holds it),
 * CO_EINVAL for NULL. Never parks. */
CO_EXTERN int co_rwmutex_trylock(co_rwmutex_t *rw);
CO_EXTERN int co_rwmutex_tryrlock(co_rwmutex_t *rw);
CO_EXTERN void co_cond_wait(co_cond_t *c, co_mutex_t *m);
CO_EXTERN int co_cond_wait_until(co_cond_t *c, co_mutex_t *m, int64_t deadline);
CO_EXTERN void co_cond_signal(co_cond_t *c);
CO_EXTERN void co_cond_broadcast(co_cond_t *c);
CO_EXTERN void co_waitgroup_add(co_waitgroup_t *wg, int delta);
CO_EXTERN void co_waitgroup_done(co_waitgroup_t *wg);
CO_EXTERN void co_waitgroup_wait(co_waitgroup_t *wg);
CO_EXTERN int co_waitgroup_wait_until(co_waitgroup_t *wg, int64_t deadline);
CO_EXTERN void co_once(co_once_t *once, void (*fn)(void *arg), void *arg);
CO_EXTERN void co_sem_init(co_sem_t *s, int64_t size);
CO_EXTERN int co_sem_acquire(co_sem_t *s, int64_t n, int64_t deadline);
CO_EXTERN bool co_sem_try_acquire(co_sem_t *s, int64_t n);
CO_EXTERN void co_sem_release(co_sem_t *s, int64_t n);
CO_EXTERN void co_spinlock_lock(co_spinlock_t *l);
CO_EXTERN void co_spinlock_unlock(co_spinlock_t *l);

/* ---- a concurrent map (Go's sync.Map) ---------------------------------- */
/* Keys are byte strings (key, len), copied in; values are the caller's
 * pointers, never dereferenced. Loads take no lock. docs/sync.md. */
typedef struct co_map co_map_t;
CO_EXTERN int co_map_new(co_map_t **out);
CO_EXTERN void co_map_free(co_map_t *m); /* no call on m may be running */
CO_EXTERN bool co_map_load(co_map_t *m, const void *key, size_t len, void **value);
CO_EXTERN int co_map_store(co_map_t *m, const void *key, size_t len, void *value);
/* 1: present, *actual = its value; 0: stored, *actual = value; or an error */
CO_EXTERN int co_map_load_or_store(co_map_t *m, const void *key, size_t len, void *value, void **actual);
CO_EXTERN bool co_map_load_and_delete(co_map_t *m, const void *key, size_t len, void **value);
CO_EXTERN bool co_map_delete(co_map_t *m, const void *key, size_t len);
/* 1: was present, *previous = the old value; 0: added; or an error */
CO_EXTERN int co_map_swap(co_map_t *m, const void *key, size_t len, void *value, void **previous);
CO_EXTERN bool co_map_compare_and_swap(co_map_t *m, const void *key, size_t len, void *old, void *value);
CO_EXTERN bool co_map_compare_and_delete(co_map_t *m, const void *key, size_t len, void *old);
/* fn returns false to stop; it may call the map and may park. */
CO_EXTERN void co_map_range(co_map_t *m, bool (*fn)(const void *key, size_t len, void *value, void *arg),
                            void *arg);
CO_EXTERN size_t co_map_len(co_map_t *m);

/* ---- an object cache (Go's sync.Pool) ---------------------------------- */
/* get returns a cached object or new_fn(arg)'s (NULL if new_fn is NULL or
 * fails); put caches obj (NULL: ignored). Objects idle for two sweeps (2 s
 * each) are passed to free_fn(obj, arg). docs/sync.md. */
typedef struct co_cache co_cache_t;
CO_EXTERN int co_cache_new(co_cache_t **out, void *(*new_fn)(void *arg), void (*free_fn)(void *obj, void *arg),
                           void *arg);
CO_EXTERN void *co_cache_get(co_cache_t *c);
CO_EXTERN void co_cache_put(co_cache_t *c, void *obj);
CO_EXTERN int co_cache_set_period(co_cache_t *c, int64_t period_ns); /* 0: the default, 2 s */
CO_EXTERN void co_cache_free(co_cache_t *c); /* no call on c may be running; frees cached objects */

/* ---- channels and select ----------------------------------------------- */
typedef struct co_chan co_chan_t;
CO_EXTERN int co_chan_new(co_chan_t **out, size_t elem_size, size_t cap);
CO_EXTERN int co_chan_send(co_chan_t *ch, const void *elem, int64_t deadline);
CO_EXTERN int co_chan_recv(co_chan_t *ch, void *elem, int64_t deadline);
CO_EXTERN int co_chan_close(co_chan_t *ch);
CO_EXTERN size_t co_chan_len(const co_chan_t *ch);
CO_EXTERN size_t co_chan_cap(const co_chan_t *ch);
CO_EXTERN void co_chan_free(co_chan_t *ch);

enum { CO_SEND = 1, CO_RECV = 2 };
typedef struct co_case {
    co_chan_t *ch; /* NULL: never ready */
    int op;        /* CO_SEND or CO_RECV */
    void *elem;    /* value to send / where to receive */
    int result;    /* set on the case that fired: 0, CO_ECLOSED, or CO_EPERM (a send on a receive-only channel) */
} co_case_t;
CO_EXTERN int co_select(co_case_t *cases, int n, int64_t deadline);

typedef struct co_ticker co_ticker_t;
CO_EXTERN int co_ticker_new(co_ticker_t **out, int64_t period_ns);
CO_EXTERN co_chan_t *co_ticker_chan(co_ticker_t *t);
CO_EXTERN void co_ticker_stop(co_ticker_t *t);

/* ---- timers (Go's time.NewTimer, time.After, time.AfterFunc) ----------- */
/* One-shot timers on the runtime's per-P timer heaps (docs/chan.md,
 * "Timers"). A duration ns <= 0 fires at once, as in Go. Every timer holds
 * the runtime (co_shutdown: CO_EBUSY) until co_timer_free, which stops it
 * and frees it and its channel. */
typedef struct co_timer co_timer_t;
/* Go's time.NewTimer: co_timer_chan(t), capacity 1, receives co_now()
 * (int64_t) once, ns from now. 0, CO_EINVAL (out NULL) or CO_ENOMEM. */
CO_EXTERN int co_timer_new(co_timer_t **out, int64_t ns);
/* Go's time.After. C has no garbage collector, so it hands back the timer,
 * not just the channel: select on co_timer_chan(*out), then co_timer_free
 * it (whether it fired or not). Same as co_timer_new otherwise. */
CO_EXTERN int co_after(co_timer_t **out, int64_t ns);
/* Go's time.AfterFunc: fn(arg) runs as a new coroutine ns from now. 0,
 * CO_EINVAL (out or fn NULL) or CO_ENOMEM. Its co_timer_chan is NULL. */
CO_EXTERN int co_after_func(co_timer_t **out, int64_t ns, void (*fn)(void *arg), void *arg);
CO_EXTERN co_chan_t *co_timer_chan(co_timer_t *t); /* NULL for NULL or a co_after_func timer */
/* True if this call stopped it: its value or function had not been
 * delivered and now never will be. After it returns no value of the
 * stopped arming can be received (Go 1.23). NULL: fatal. */
CO_EXTERN bool co_timer_stop(co_timer_t *t);
/* Stop, then arm again to fire ns from now: 1 if the stop stopped it, 0 if
 * it had fired or been stopped, CO_EINVAL for NULL. No stale value after
 * it returns (Go 1.23). */
CO_EXTERN int co_timer_reset(co_timer_t *t, int64_t ns);
CO_EXTERN void co_timer_free(co_timer_t *t); /* stop, free it and its channel; NULL: nothing */

/* ---- context and group ------------------------------------------------- */
typedef struct co_ctx co_ctx_t;
CO_EXTERN co_ctx_t *co_ctx_background(void);
CO_EXTERN int co_ctx_with_cancel(co_ctx_t **out, co_ctx_t *parent);
CO_EXTERN int co_ctx_with_deadline(co_ctx_t **out, co_ctx_t *parent, int64_t deadline);
CO_EXTERN int co_ctx_with_timeout(co_ctx_t **out, co_ctx_t *parent, int64_t ns);
CO_EXTERN int co_ctx_with_value(co_ctx_t **out, co_ctx_t *parent, const void *key, void *value);
CO_EXTERN void co_ctx_cancel(co_ctx_t *ctx);
/* Receive-only (Go's <-chan struct{}): co_chan_send/co_chan_close on it
 * answer CO_EPERM, co_chan_free of it aborts; it closes when ctx is
 * canceled. NULL for the background context and for NULL. */
CO_EXTERN co_chan_t *co_ctx_done(co_ctx_t *ctx);
CO_EXTERN int co_ctx_err(co_ctx_t *ctx);
CO_EXTERN void *co_ctx_value(co_ctx_t *ctx, const void *key);
/* Go's Context.Deadline: true and *deadline = the absolute co_now() time at
 * which ctx is cancelled with CO_ETIMEDOUT (its own or an ancestor's,
 * whichever is earliest); false and *deadline = CO_FOREVER if it has none
 * (NULL ctx included). deadline may be NULL. */
CO_EXTERN bool co_ctx_deadline(co_ctx_t *ctx, int64_t *deadline);
CO_EXTERN void co_ctx_free(co_ctx_t *ctx);

typedef struct co_group co_group_t;
CO_EXTERN int co_group_new(co_group_t **out, co_ctx_t *parent);
CO_EXTERN void co_group_limit(co_group_t *g, int n);
CO_EXTERN int co_group_go(co_group_t *g, int (*fn)(void *arg), void *arg);
CO_EXTERN int co_group_wait(co_group_t *g);
CO_EXTERN co_ctx_t *co_group_ctx(co_group_t *g);
CO_EXTERN void co_group_free(co_group_t *g);

/* ---- panics ------------------------------------------------------------ */
CO_EXTERN CO_NORETURN void co_panic(void *value);
CO_EXTERN int co_recover(void (*fn)(void *arg), void *arg, void **value);

/* ---- the pool (ants) --------------------------------------------------- */
typedef struct co_pool co_pool_t;
typedef struct co_pool_opts {
    int64_t expiry_ns;
    bool prealloc;
    int max_blocking;
    bool nonblocking;
    bool disable_purge;
    void (*panic_handler)(void *value, void *ctx);
    void (*logger)(const char *line, void *ctx);
    void *ctx;
    size_t stack_size;
} co_pool_opts_t;

CO_EXTERN int co_pool_new(co_pool_t **out, int capacity, const co_pool_opts_t *opts);
CO_EXTERN int co_pool_new_func(co_pool_t **out, int capacity, void (*fn)(void *arg),
                               const co_pool_opts_t *opts);
CO_EXTERN int co_pool_submit(co_pool_t *p, void (*fn)(void *arg), void *arg);
CO_EXTERN int co_pool_submit_until(co_pool_t *p, void (*fn)(void *arg), void *arg,
                                   int64_t deadline);
CO_EXTERN int co_pool_invoke(co_pool_t *p, void *arg);
CO_EXTERN int co_pool_running(const co_pool_t *p);
CO_EXTERN int co_pool_available(const co_pool_t *p);
CO_EXTERN int co_pool_waiting(const co_pool_t *p);
CO_EXTERN int co_pool_cap(const co_pool_t *p);
CO_EXTERN void co_pool_tune(co_pool_t *p, int capacity);
CO_EXTERN bool co_pool_is_closed(const co_pool_t *p);
CO_EXTERN void co_pool_release(co_pool_t *p);
CO_EXTERN int co_pool_release_timeout(co_pool_t *p, int64_t ns);
CO_EXTERN void co_pool_reboot(co_pool_t *p);
CO_EXTERN int co_pool_wait_idle(co_pool_t *p, int64_t deadline);
CO_EXTERN void co_pool_destroy(co_pool_t *p);

typedef struct co_pool_stats {
    int64_t running, idle, busy, waiting;
    int64_t submitted, completed, rejected, panicked;
} co_pool_stats_t;
CO_EXTERN void co_pool_stats(const co_pool_t *p, co_pool_stats_t *out);

CO_EXTERN int co_submit(void (*fn)(void *arg), void *arg);
CO_EXTERN co_pool_t *co_default_pool(void);

typedef struct co_multipool co_multipool_t;
enum { CO_LB_ROUND_ROBIN = 1, CO_LB_LEAST_TASKS = 2 };
CO_EXTERN int co_multipool_new(co_multipool_t **out, int n, int cap_each, int lb,
                               const co_pool_opts_t *opts);
CO_EXTERN int co_multipool_new_func(co_multipool_t **out, int n, int cap_each,
                                    void (*fn)(void *arg), int lb, const co_pool_opts_t *opts);
CO_EXTERN int co_multipool_submit(co_multipool_t *mp, void (*fn)(void *arg), void *arg);
CO_EXTERN int co_multipool_invoke(co_multipool_t *mp, void *arg);
CO_EXTERN int co_multipool_running(const co_multipool_t *mp);
CO_EXTERN int co_multipool_available(const co_multipool_t *mp);
CO_EXTERN int co_multipool_waiting(const co_multipool_t *mp);
CO_EXTERN int co_multipool_cap(const co_multipool_t *mp);
CO_EXTERN int co_multipool_running_by_index(const co_multipool_t *mp, int i);
CO_EXTERN int co_multipool_available_by_index(const co_multipool_t *mp, int i);
CO_EXTERN int co_multipool_waiting_by_index(const co_multipool_t *mp, int i);
CO_EXTERN void co_multipool_tune(co_multipool_t *mp, int cap_each);
CO_EXTERN bool co_multipool_is_closed(const co_multipool_t *mp);
CO_EXTERN int co_multipool_release_timeout(co_multipool_t *mp, int64_t ns);
CO_EXTERN void co_multipool_reboot(co_multipool_t *mp);
CO_EXTERN void co_multipool_destroy(co_multipool_t *mp);

/* ---- I/O on the netpoller ---------------------------------------------- */
enum { CO_READABLE = 1, CO_WRITABLE = 2 };
CO_EXTERN ssize_t co_read(int fd, void *buf, size_t len, int64_t deadline);
CO_EXTERN ssize_t co_write(int fd, const void *buf, size_t len, int64_t deadline);
CO_EXTERN int co_accept(int fd, struct sockaddr *addr, socklen_t *addrlen, int64_t deadline);
CO_EXTERN int co_connect(int fd, const struct sockaddr *addr, socklen_t addrlen, int64_t deadline);
CO_EXTERN int co_wait_fd(int fd, int events, int64_t deadline);
CO_EXTERN int co_close(int fd);
CO_EXTERN int co_blocking(void (*fn)(void *arg), void *arg);

/* ---- foreign code: descriptors closed behind colony's back ------------- */
/* fd is going away, or was closed with close(2) behind colony's back (a
 * library's own close): every coroutine or thread waiting on it in co_read,
 * co_write, co_wait_fd & co is woken with CO_ECLOSED, colony drops it from
 * the netpoller and forgets what it knew, and does NOT close it. It returns
 * once the last operation under way on fd has left, so that the caller may
 * close fd and its number name a new file at once. 0 (also for an fd
 * colony never saw) or -EBADF for a negative fd. co_wait_fd needs
 * no such call: it notices a number that names a new file by itself. */
CO_EXTERN int co_fd_forget(int fd);
/* co_blocking's cap: at most this many threads inside co_blocking at once
 * (default 128, or $COLONY_BLOCKING_MAX); callers beyond it wait, in FIFO
 * order, parked as coroutines. n > 0 sets it, 0 only asks; returns the
 * previous cap, CO_EINVAL for n < 0. */
CO_EXTERN int co_blocking_max(int n);
/* The cap, and in *busy / *waiting (each may be NULL) how many coroutines
 * are inside co_blocking now and how many wait for a slot (a snapshot). */
CO_EXTERN int co_blocking_stats(int *busy, int *waiting);
/* co_blocking, but the coroutine goes on on the thread it called from,
 * before and after fn: it never waits for a slot (it is counted, possibly
 * beyond the cap) and, coming back, its thread waits for a P rather than
 * letting another thread take the coroutine on. For foreign code that
 * keeps the address of errno or of a thread-local across the call. */
CO_EXTERN int co_blocking_on_thread(void (*fn)(void *arg), void *arg);
/* The calling coroutine's thread, as a token for co_thread_return (NULL
 * on a plain thread). */
CO_EXTERN void *co_thread_home(void);
/* Back to the thread co_thread_home named: a coroutine that parked since
 * and runs on another thread now waits until that thread runs it (without
 * holding either thread meanwhile); on that thread already, or with home
 * NULL, it returns at once. For foreign code that keeps the address of
 * errno or of a thread-local across a call that parks (docs/hook.md). */
CO_EXTERN void co_thread_return(void *home);
/* Whether a wait here parks a coroutine (true: a coroutine holding a P)
 * or blocks the thread (false: a plain thread, or inside co_blocking's fn):
 * for code that interposes blocking calls. */
CO_EXTERN bool co_parkable(void);

/* ---- net: dial and listen by address, the resolver --------------------- */
/* docs/net.md. Networks: "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6",
 * "unix", "unixgram", "unixpacket". Addresses in Go's syntax: "host:port",
 * "[::1]:80", ":8080" (every address to listen on; the local system to
 * dial), a port may be a service name ("http"); for unix ones a path, or
 * "@name" in the abstract namespace. A name is resolved with the deadline;
 * a dial to a name tries its addresses as Go's dialer does (IPv6 and IPv4
 * raced, RFC 6555). Both return a new non-blocking fd (>= 0) usable with
 * every co_* I/O call, or a negative code: CO_ENETUNKNOWN, CO_EADDR,
 * CO_ENOTFOUND, CO_EDNS, CO_ETIMEDOUT, CO_EINVAL (NULL), -errno. */
struct co_listen_opts {
    int backlog;          /* listen(2)'s; 0: SOMAXCONN */
    bool reuseport;       /* SO_REUSEPORT: several listeners share the port */
    bool delay;           /* keep Nagle's algorithm (TCP_NODELAY is set by default, as in Go) */
    int64_t keepalive_ns; /* TCP keep-alive idle and interval: 0: 15 s, as Go; < 0: off */
    bool v6only;          /* "tcp"/"udp" on an IPv6 address: IPv6 only, not dual stack */
};
CO_EXTERN int co_dial(const char *network, const char *address, int64_t deadline);
/* co_dial that ctx's cancellation also ends (Go's DialContext): the
 * lookup and a connect under way; co_ctx_err's code. ctx may be NULL. */
CO_EXTERN int co_dial_ctx(co_ctx_t *ctx, const char *network, const char *address,
                          int64_t deadline);
CO_EXTERN int co_listen(const char *network, const char *address,
                        const struct co_listen_opts *opts); /* opts may be NULL */

/* The resolver (Go's net.DefaultResolver): c-ares on the netpoller where
 * built with it (/etc/hosts, then DNS per /etc/resolv.conf), getaddrinfo
 * in co_blocking otherwise and for names only other NSS sources know.
 * ctx may be NULL; its cancellation ends the lookup (co_ctx_err's code).
 * co_lookup_host writes up to max addresses of host (port 0), IPv6 and
 * IPv4, and returns how many (>= 1); a literal IP is its own answer.
 * co_lookup_addr writes addr's name (NUL-terminated, cut to cap). */
CO_EXTERN int co_lookup_host(co_ctx_t *ctx, const char *host, struct sockaddr_storage *out,
                             int max, int64_t deadline);
CO_EXTERN int co_lookup_addr(co_ctx_t *ctx, const struct sockaddr *addr, socklen_t addrlen,
                             char *name, size_t cap, int64_t deadline);
/* Replace the resolver's configuration for lookups that start from now
 * on; NULL: the system's again. Zero fields: /etc/resolv.conf's. -ENOTSUP
 * without c-ares. */
typedef struct co_resolver_conf {
    const char *servers; /* "127.0.0.1:53,[::1]:5353"; NULL: resolv.conf's */
    const char *search;  /* "a.example b.example"; NULL: resolv.conf's */
    int ndots;           /* dots in a name below which search domains go first; 0: resolv.conf's */
    int64_t timeout_ns;  /* first try's timeout per server; 0: resolv.conf's */
    int attempts;        /* tries per server; 0: resolv.conf's */
} co_resolver_conf_t;
CO_EXTERN int co_resolver_configure(const co_resolver_conf_t *conf);

/* ---- net: datagrams, messages and vectored I/O ------------------------- */
/* docs/net.md. As co_read/co_write: the deadline, from coroutines and
 * plain threads, -EBADF, CO_ECLOSED, CO_ETIMEDOUT, CO_EINVAL, -errno.
 * co_writev and co_sendfile send all of it or fail (what went out before
 * a co_close cut them is returned, as co_write does); the others make one
 * system call's worth of progress. flags go to the system call (MSG_*;
 * MSG_NOSIGNAL is always added to sends). */
struct iovec;
struct msghdr;
CO_EXTERN ssize_t co_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from,
                              socklen_t *fromlen, int64_t deadline);
CO_EXTERN ssize_t co_sendto(int fd, const void *buf, size_t len, int flags,
                            const struct sockaddr *to, socklen_t tolen, int64_t deadline);
CO_EXTERN ssize_t co_recvmsg(int fd, struct msghdr *msg, int flags, int64_t deadline);
CO_EXTERN ssize_t co_sendmsg(int fd, const struct msghdr *msg, int flags, int64_t deadline);
/* Batches of datagrams in one system call (recvmmsg(2), sendmmsg(2)): n
 * in 1..1024. co_recvmmsg waits until at least one datagram is queued and
 * returns how many it took (each msgs[i].msg_len set); co_sendmmsg returns
 * how many went out (at least 1; the caller sends the rest again). */
struct mmsghdr;
CO_EXTERN int co_recvmmsg(int fd, struct mmsghdr *msgs, unsigned n, int flags, int64_t deadline);
CO_EXTERN int co_sendmmsg(int fd, struct mmsghdr *msgs, unsigned n, int flags, int64_t deadline);
CO_EXTERN ssize_t co_readv(int fd, const struct iovec *iov, int iovcnt, int64_t deadline);
CO_EXTERN ssize_t co_writev(int fd, const struct iovec *iov, int iovcnt, int64_t deadline);
CO_EXTERN ssize_t co_sendfile(int out_fd, int in_fd, off_t *offset, size_t count,
                              int64_t deadline);

/* ---- signals as channel messages (Go's os/signal) ---------------------- */
/* Relay signals to ch (elements int: the signal's number) from now on, in
 * addition to what ch already gets; n == 0 (sigs may be NULL): every signal
 * that can be relayed. Sends never block: a full channel misses the signal.
 * docs/signal.md has the rules (threads, masks, SIGPIPE). */
CO_EXTERN int co_signal_notify(co_chan_t *ch, const int *sigs, int n);
/* No more signals to ch once this returns; a signal no channel wants gets
 * the program's own action back. */
CO_EXTERN int co_signal_stop(co_chan_t *ch);
/* Ignore these signals (SIG_IGN), and relay them to no channel any more
 * (Go's signal.Ignore). */
CO_EXTERN int co_signal_ignore(const int *sigs, int n);

/* ---- TLS on coroutines ------------------------------------------------- */
/* TLS over a connected socket with OpenSSL (docs/tls.md). Built without
 * OpenSSL, every call answers -ENOTSUP (co_tls_available() is false). */
typedef struct co_tls_config co_tls_config_t;
typedef struct co_tls co_tls_t;
enum { CO_TLS_CLIENT = 1, CO_TLS_SERVER = 2 };
CO_EXTERN bool co_tls_available(void);
/* A client config verifies the server against the system's CA store. */
CO_EXTERN int co_tls_config_new(co_tls_config_t **out, int role);
CO_EXTERN int co_tls_config_cert(co_tls_config_t *cfg, const char *cert_pem, const char *key_pem);
/* Trust only the CAs in this PEM file (instead of the system store). */
CO_EXTERN int co_tls_config_ca(co_tls_config_t *cfg, const char *ca_pem);
/* Client: false skips certificate verification (Go's InsecureSkipVerify).
 * Server: true requires a client certificate signed by the CA. */
CO_EXTERN int co_tls_config_verify(co_tls_config_t *cfg, bool verify);
CO_EXTERN int co_tls_config_alpn(co_tls_config_t *cfg, const char *const *protos, int n);
CO_EXTERN void co_tls_config_free(co_tls_config_t *cfg);
/* Handshake on fd, which the call takes: on failure it is closed. */
CO_EXTERN int co_tls_client(co_tls_t **out, int fd, co_tls_config_t *cfg, const char *servername,
                            int64_t deadline);
CO_EXTERN int co_tls_server(co_tls_t **out, int fd, co_tls_config_t *cfg, int64_t deadline);
CO_EXTERN ssize_t co_tls_read(co_tls_t *c, void *buf, size_t len, int64_t deadline);
CO_EXTERN ssize_t co_tls_write(co_tls_t *c, const void *buf, size_t len, int64_t deadline);
CO_EXTERN int co_tls_shutdown(co_tls_t *c, int64_t deadline);
CO_EXTERN int co_tls_close(co_tls_t *c);
CO_EXTERN int co_tls_fd(const co_tls_t *c);
CO_EXTERN const char *co_tls_alpn(const co_tls_t *c);
CO_EXTERN const char *co_tls_servername(const co_tls_t *c);
CO_EXTERN bool co_tls_resumed(const co_tls_t *c);
CO_EXTERN const char *co_tls_version(const co_tls_t *c);

/* ---- debug ------------------------------------------------------------- */
typedef struct co_sched_stats {
    int procs, idle_procs, threads, spinning_threads, idle_threads;
    int64_t global_runq, coroutines;
} co_sched_stats_t;
CO_EXTERN void co_sched_stats(co_sched_stats_t *out);
/* The local run queue length of each P, the bracketed part of schedtrace:
 * writes min(procs, max) entries to lens and returns how many. */
CO_EXTERN int co_sched_runq_lens(int *lens, int max);
CO_EXTERN void co_dump(FILE *out);
/* What is alive now: what keeps co_shutdown answering CO_EBUSY. A
 * snapshot; counts move while it is taken. */
typedef struct co_alive {
    int coroutines;            /* not yet exited, in any state */
    int runnable, running, waiting;
    int plain_parked;          /* plain threads parked inside a colony call */
    int blocking;              /* coroutines inside co_blocking calls now */
    int pools;                 /* pools made and not yet destroyed (the default pool too) */
    int timers;                /* timers made by co_timer_new / co_after_func not yet freed */
    int tickers;               /* tickers not yet stopped */
    int caches;                /* co_cache objects holding objects */
    int plain_io;              /* I/O calls of plain threads under way */
} co_alive_t;
/* Fills *out: 0; CO_EINVAL for NULL. All zero when the runtime is down. */
CO_EXTERN int co_alive(co_alive_t *out);
/* The same as one line, then the waiting coroutines counted by wait
 * reason, to out (NULL: stderr): "colony: alive: 3 coroutines (0
 * runnable, 0 running, 3 waiting), 1 pool, ...". For a co_shutdown that
 * answered CO_EBUSY; co_dump then shows each coroutine's stack. */
CO_EXTERN void co_dump_alive(FILE *out);
/* co_dump prints every live coroutine as Go does (`coroutine 7 'name'
 * [waiting, chan receive]:`), its entry function and its stack where the
 * build can unwind it; SIGQUIT prints the same and exits 2. COLONY_DEBUG
 * words: nodeadlock (no deadlock detection), nosigquit, nocrash (no crash
 * reports), leaks=1 (list coroutines alive when co_main's function
 * returns). docs/debugging.md has the rules and what each cannot see. */
/* The execution trace (docs/trace.md): scheduler events recorded from now
 * on, written to path as Chrome trace-event JSON (Perfetto,
 * chrome://tracing, tools/colony-trace) by co_trace_stop. COLONY_TRACE=path
 * traces the whole run. co_trace_start: 0, CO_EINVAL for a NULL or empty
 * path, CO_EBUSY while a trace is on, -errno if path cannot be written,
 * CO_ENOMEM. co_trace_stop: 0, CO_EINVAL if no trace is on, -errno if the
 * file could not be written. */
CO_EXTERN int co_trace_start(const char *path);
CO_EXTERN int co_trace_stop(void);

#ifdef __cplusplus
}
#endif
#endif /* COLONY_H */
