/* libcurl's easy API from coroutines through libcolony_hook.so, fetching
 * from colony's own HTTP server (examples/http_server.c) in this process:
 * 1,000 coroutines (300 in sanitizer builds), each body and status
 * checked, a bounded thread count, no fd left. Behaviour, not timing. */
// ctest-timeout: 60
// ctest-preload-hook
// ctest-uses: libcurl
// ctest-no-chaos
#define _GNU_SOURCE 1
#include "t.h"
#include "test_hook_servers.h"

#include <colony.h>

#include <dlfcn.h>
#include <stdint.h>

#if !COLONY_HAVE_LIBCURL
int main(void) {
    fprintf(stderr, "skip: built without libcurl (libcurl4-openssl-dev)\n");
    return 77;
}
#else
#define HTTP_SERVER_NO_MAIN 1
#include "../examples/http_server.c"

#include <curl/curl.h>

#define MS 1000000LL
#define GIVE_UP (20000 * MS)

static char url[64];
static int ok_count, done_count;

struct body {
    char b[64];
    size_t n;
};
static size_t on_data(char *p, size_t sz, size_t nm, void *ud) {
    struct body *b = ud;
    size_t k = sz * nm;
    if (b->n + k < sizeof b->b) {
        memcpy(b->b + b->n, p, k);
        b->n += k;
    }
    return k;
}

static int fetch_once(CURL *h) {
    struct body b = {.n = 0};
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    b.b[b.n] = 0;
    if (rc != CURLE_OK || code != 200 || strcmp(b.b, "Hello, World!\n") != 0) {
        fprintf(stderr, "fetch: %s, code %ld, body '%s'\n", curl_easy_strerror(rc), code, b.b);
        return 0;
    }
    return 1;
}

static void fetcher(void *arg) {
    (void)arg;
    CURL *h = curl_easy_init();
    int ok = h != NULL;
    if (h) {
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 15L);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
        ok = fetch_once(h) && fetch_once(h); /* the second on the kept-alive connection */
        curl_easy_cleanup(h);
    }
    if (ok) __atomic_add_fetch(&ok_count, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&done_count, 1, __ATOMIC_RELEASE);
}

static void test_fetch_many(void) {
    http_config_t cfg = {.pool_size = 256};
    http_server_t *s = NULL;
    CHECK_EQ(http_server_start(&s, &cfg), 0);
    if (!s) return;
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", http_server_port(s));
    int n = t_sanitized() ? 300 : 1000;
    ok_count = done_count = 0;
    co_sched_stats_t st;
    co_sched_stats(&st);
    int t0 = st.threads, tmax = t0;
    for (int i = 0; i < n; i++) CHECK_EQ(co_go(fetcher, NULL), 0);
    int64_t t = co_now();
    while (__atomic_load_n(&done_count, __ATOMIC_ACQUIRE) < n && co_now() - t < GIVE_UP) {
        co_sched_stats(&st);
        if (st.threads > tmax) tmax = st.threads;
        co_sleep(MS);
    }
    CHECK_EQ(ok_count, n);
    fprintf(stderr, "curl: %d fetchers x 2 requests, threads %d -> max %d\n", n, t0, tmax);
    http_server_stop(s);
    http_server_wait(s, NULL);
}

static int run(void *arg) {
    (void)arg;
    int fds0 = t_count_fds();
    T_RUN(test_fetch_many);
    CHECK_EQ(t_count_fds(), fds0);
    return 0;
}

int main(void) {
    if (!dlsym(RTLD_DEFAULT, "colony_hook_active")) {
        fprintf(stderr, "skip: libcolony_hook.so is not preloaded\n");
        return 77;
    }
    hs_preload_drop();
    signal(SIGPIPE, SIG_IGN);
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < 4096 && r.rlim_max >= 4096) {
        r.rlim_cur = 4096;
        setrlimit(RLIMIT_NOFILE, &r);
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "skip: curl_global_init failed\n");
        return 77;
    }
    t_begin(50);
    co_main(run, NULL);
    curl_global_cleanup();
    return t_end();
}
#endif
