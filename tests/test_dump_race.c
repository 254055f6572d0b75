/* co_dump while a coroutine it lists wakes and exits: the dump writes to a
 * slow stream (here a cookie stream that, on the victim's header, wakes
 * it and waits for its exit), so the victim's stack (not of the default
 * size: unmapped at exit) is gone by the time a dump that unwound after
 * printing would read it. The dump unwinds each coroutine before printing
 * any of it, so it completes; the victim shows its frames or a note. */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"

#include <pthread.h>
#include <stdio.h>

static co_chan_t *ch;
static int exited; /* atomic */

static void victim(void *arg) {
    (void)arg;
    int v;
    co_chan_recv(ch, &v, CO_FOREVER);
    __atomic_store_n(&exited, 1, __ATOMIC_SEQ_CST);
}

static void *waker(void *arg) {
    (void)arg;
    int v = 1;
    co_chan_send(ch, &v, CO_FOREVER);
    return NULL;
}

static char seen[65536];
static size_t nseen;
static int woke; /* the victim was woken while its entry was being written */

static ssize_t slow_write(void *cookie, const char *buf, size_t n) {
    (void)cookie;
    size_t k = n < sizeof seen - 1 - nseen ? n : sizeof seen - 1 - nseen;
    memcpy(seen + nseen, buf, k);
    nseen += k;
    seen[nseen] = 0;
    if (!woke && strstr(seen, "'victim' [waiting")) {
        woke = 1;
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, waker, NULL), 0);
        pthread_join(t, NULL);
        while (!__atomic_load_n(&exited, __ATOMIC_SEQ_CST)) usleep(1000);
        usleep(50 * 1000); /* its exit has unmapped its stack */
    }
    return (ssize_t)n;
}

static void test_victim_exits_mid_dump(void) {
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    co_attr_t a = {64 * 1024, "victim"}; /* not the default size: unmapped at exit */
    CHECK_EQ(co_go_with(&a, victim, NULL), 0);
    while (co_count() < 1) usleep(1000);
    usleep(50 * 1000); /* parked */
    FILE *f = fopencookie(NULL, "w", (cookie_io_functions_t){.write = slow_write});
    CHECK(f != NULL);
    setvbuf(f, NULL, _IONBF, 0);
    co_dump(f); /* from a plain thread */
    fclose(f);
    CHECK_EQ(woke, 1);
    CHECK(strstr(seen, "'victim' [waiting") != NULL);
    CHECK_EQ(__atomic_load_n(&exited, __ATOMIC_SEQ_CST), 1);
    co_chan_free(ch);
}

int main(void) {
    t_begin(50);
    co_config_t c = {2, 0};
    CHECK_EQ(co_init(&c), 0);
    T_RUN(test_victim_exits_mid_dump);
    CHECK_EQ(co_shutdown(), 0);
    return t_end();
}
