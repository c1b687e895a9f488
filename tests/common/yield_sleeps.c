/* yield_sleeps.c: preloaded into the ranks that the tests start under mpirun (tests/common/mod.rs,
 * mpirun_command). A rank waiting in Open MPI (mpi_yield_when_idle), in the fake NCCL or in the
 * emulating GPU runtimes polls and calls sched_yield between polls. Where ranks share cores with
 * other busy processes (make test runs two test files at once on 2 cores) a yielding rank stays
 * runnable and takes its turns, so the rank it waits for gets its core a scheduler slice later:
 * a two-rank run that meets at every collective took ten times as long beside two busy loops.
 * Here sched_yield sleeps 10 us instead (with a 1 ns timer slack, so about that long): the waiting
 * rank leaves the run queue and wakes as a sleeper. What the ranks compute is unchanged. */
#include <sys/prctl.h>
#include <time.h>

__attribute__((constructor)) static void precise_sleeps(void) { prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL); }

int sched_yield(void) {
  struct timespec pause = {0, 10 * 1000};
  nanosleep(&pause, NULL);
  return 0;
}
