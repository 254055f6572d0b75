/* The tour: one section per area of colony. Each section lives in its own
 * file; main (tour_main.c) runs them in order. */
#ifndef COLONY_TOUR_H
#define COLONY_TOUR_H
#include <colony.h>
void tour_runtime(void); /* tour_runtime.c: spawn, wait, sleep, schedtrace */
void tour_chan(void) __attribute__((weak));  /* tour_chan.c: sync, channels, select, context */
void tour_pool(void) __attribute__((weak));  /* tour_pool.c: the ants port */
void tour_net(void) __attribute__((weak));   /* tour_net.c: netpoller, co_blocking */
void tour_trace(void) __attribute__((weak)); /* tour_trace.c: an execution trace */
#endif
