/* The colony tour: `make demo` runs this. Each section is a short,
 * readable walk through one area; see the tour_*.c files. */
#include "tour.h"

#include <stdio.h>
#include <stdlib.h>

static int tour(void *arg) {
    (void)arg;
    tour_runtime();
    if (tour_chan) tour_chan();
    if (tour_pool) tour_pool();
    if (tour_net) tour_net();
    if (tour_trace) tour_trace();
    return 0;
}

int main(void) {
    printf("colony tour — Go's concurrency in C, on %d Ps\n\n", co_procs());
    int rc = co_main(tour, NULL);
    int sd = co_shutdown();
    if (sd < 0) fprintf(stderr, "co_shutdown: %s\n", co_strerror(sd));
    printf("\ntour finished (%s)\n", rc == 0 && sd == 0 ? "ok" : "with errors");
    return rc == 0 && sd == 0 ? 0 : 1;
}
