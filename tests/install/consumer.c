/* A program built against an installed colony, as a user builds one: only
 * <colony.h> and the library (tests/install/run.sh). Prints "consumer ok
 * <sum>" and exits 0 when 100 coroutines summed 0..99 over a channel. */
#include <colony.h>
#include <stdio.h>

static co_chan_t *ch;
static co_waitgroup_t wg; /* zero: ready to use */

static void send_one(void *arg) {
    int v = (int)(long)arg;
    co_gosched(); /* builds under every C++ standard, C++20's co_yield keyword included */
    co_chan_send(ch, &v, CO_FOREVER);
    co_waitgroup_done(&wg);
}

static int run(void *arg) {
    (void)arg;
    if (co_chan_new(&ch, sizeof(int), 0) != 0) return 2;
    co_waitgroup_add(&wg, 100);
    for (long i = 0; i < 100; i++)
        if (co_go(send_one, (void *)i) != 0) return 3;
    long sum = 0;
    for (int i = 0; i < 100; i++) {
        int v;
        if (co_chan_recv(ch, &v, CO_FOREVER) != 0) return 4;
        sum += v;
    }
    co_waitgroup_wait(&wg);
    co_chan_free(ch);
    printf("consumer ok %ld\n", sum);
    return sum == 4950 ? 0 : 5;
}

int main(void) { return co_main(run, NULL); }
