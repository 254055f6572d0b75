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
 *        co_group_limit, co_sched_stats, ...);
 *      a free or destroy of NULL does nothing, as free(NULL) (co_chan_free,
 *        co_ticker_stop, co_ctx_free, co_group_free);
 *      a getter that returns a value gives the one documented for NULL
 *        (co_chan_len/cap: 0; co_ticker_chan, co_ctx_done, co_ctx_value,
 *        co_group_ctx: NULL).
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
CO_EXTERN const char *co_strerror(int err);

/* ---- time -------------------------------------------------------------- */
#define CO_FOREVER ((int64_t)-1)
CO_EXTERN int64_t co_now(void);                /* monotonic nanoseconds */
CO_EXTERN int64_t co_deadline_after(int64_t ns); /* co_now()+ns; CO_FOREVER if ns < 0 or if the sum overflows */

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

CO_EXTERN int co_init(const co_config_t *cfg);
CO_EXTERN int co_shutdown(void);
CO_EXTERN int co_main(int (*fn)(void *arg), void *arg);
/* Start fn(arg) as a coroutine: 0, CO_EINVAL or CO_ENOMEM. From a
 * coroutine whose P already has 256 coroutines queued (or the global queue
 * 256 per P), it yields once before returning (spawn back-pressure,
 * docs/runtime.md). */
CO_EXTERN int co_go(void (*fn)(void *arg), void *arg);
CO_EXTERN int co_go_with(const co_attr_t *attr, void (*fn)(void *arg), void *arg);
CO_EXTERN void co_yield(void);
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

/* ---- an object cache (Go's sync.Pool) ---------------------------------- */

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

/* ---- net: dial and listen by address, the resolver --------------------- */

/* ---- net: datagrams, messages and vectored I/O ------------------------- */

/* ---- signals as channel messages (Go's os/signal) ---------------------- */

/* ---- TLS on coroutines ------------------------------------------------- */

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
/* co_dump prints every live coroutine as Go does (`coroutine 7 'name'
 * [waiting, chan receive]:`), its entry function and its stack where the
 * build can unwind it; SIGQUIT prints the same and exits 2. COLONY_DEBUG
 * words: nodeadlock (no deadlock detection), nosigquit, nocrash (no crash
 * reports), leaks=1 (list coroutines alive when co_main's function
 * returns). docs/debugging.md has the rules and what each cannot see. */

#ifdef __cplusplus
}
#endif
#endif /* COLONY_H */
