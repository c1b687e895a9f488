//! A small persistent thread pool: the calling thread plus `threads - 1` parked workers share the
//! indexed tasks of one `run` call, claiming them dynamically from an atomic counter.
//!
//! Protocol, in one paragraph. `run` publishes a stack-allocated `Job` through an atomic pointer
//! and bumps an epoch counter. Workers spin on the epoch for a few tens of microseconds and then
//! sleep on a condvar, so an idle pool costs no CPU (many MPI ranks may share a few cores). A
//! worker announces itself in `active` before it reads the job pointer; the caller, once every
//! task has finished, clears the pointer and waits for `active` to drain, so no worker can touch
//! the job after `run` returns. Panics inside tasks are caught, every other task still runs, and
//! the first payload is re-raised on the caller. A `busy` flag makes nested calls (from inside a
//! task) and concurrent calls (from another thread) run serially on their own thread instead of
//! waiting for workers that are already taken, which could deadlock.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle thread polls before it blocks. Long enough to catch the next call of a
/// back-to-back sequence (GEMM phases, layer after layer), short enough that a rank waiting on
/// MPI does not steal a shared core for long.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// Spin iterations between two reads of the clock while polling.
const SPINS_PER_CLOCK_CHECK: u32 = 64;

type Payload = Box<dyn Any + Send + 'static>;

/// One `run` call's work. It lives on the caller's stack; workers see it through `Shared::job`.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    tasks: usize,
    next: AtomicUsize,
    finished: AtomicUsize,
    panic: Mutex<Option<Payload>>,
}

impl Job<'_> {
    /// Claims and runs tasks until none are left. Called by the caller and by every worker that
    /// joined this job.
    fn work(&self, shared: &Shared) {
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if index >= self.tasks {
                return;
            }
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (self.task)(index))) {
                let mut slot = lock(&self.panic);
                if slot.is_none() {
                    *slot = Some(payload);
                }
            }
            // SeqCst pairs with the caller's `caller_waiting` handshake in `wait_finished`, and
            // it releases this task's writes to the caller.
            if self.finished.fetch_add(1, Ordering::SeqCst) + 1 == self.tasks
                && shared.caller_waiting.load(Ordering::SeqCst)
            {
                let _guard = lock(&shared.done_lock);
                shared.done.notify_all();
            }
        }
    }

    fn all_finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst) >= self.tasks
    }
}

/// State shared by the pool handle and its workers.
struct Shared {
    /// The current job, or null between jobs. The lifetime is erased; `active` guards it.
    job: AtomicPtr<Job<'static>>,
    /// Bumped once per published job and once at shutdown; workers wait for it to change.
    epoch: AtomicU64,
    /// Workers that may currently hold a pointer to the job.
    active: AtomicUsize,
    /// Workers blocked (or about to block) on `wake`.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    wake_lock: Mutex<()>,
    wake: Condvar,
    /// Set while the caller blocks on `done` for the last tasks of a job.
    caller_waiting: AtomicBool,
    done_lock: Mutex<()>,
    done: Condvar,
}

/// Locks a mutex whose data stays consistent even if a holder panicked, so poisoning is ignored.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Polls `done` for `SPIN_BEFORE_SLEEP`; returns true as soon as it holds.
fn spin_until(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..SPINS_PER_CLOCK_CHECK {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN_BEFORE_SLEEP {
            return done();
        }
    }
}

impl Shared {
    /// Blocks until the epoch differs from `seen`, records the new epoch, and returns false when
    /// the pool is shutting down.
    fn wait_for_job(&self, seen: &mut u64) -> bool {
        let changed = |seen: u64| self.epoch.load(Ordering::SeqCst) != seen;
        if !spin_until(|| changed(*seen)) {
            let mut guard = lock(&self.wake_lock);
            // Registering as a sleeper before re-reading the epoch, both SeqCst, means that a
            // publisher either sees us here and notifies under the lock, or we see its epoch.
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            while !changed(*seen) {
                guard = self.wake.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        *seen = self.epoch.load(Ordering::SeqCst);
        !self.shutdown.load(Ordering::SeqCst)
    }

    /// Bumps the epoch and wakes sleeping workers.
    fn announce(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = lock(&self.wake_lock);
            self.wake.notify_all();
        }
    }
}

fn worker_loop(shared: &Shared) {
    let mut seen = 0;
    while shared.wait_for_job(&mut seen) {
        // Announce first, then read the pointer: the caller clears the pointer before it waits
        // for `active` to reach zero, so a non-null pointer read here stays valid until the
        // matching decrement.
        shared.active.fetch_add(1, Ordering::SeqCst);
        let job = shared.job.load(Ordering::SeqCst);
        if !job.is_null() {
            // SAFETY: see the comment above; the caller keeps the job alive while `active` > 0.
            unsafe { (*job).work(shared) };
        }
        shared.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A persistent pool of `threads - 1` workers plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    busy: AtomicBool,
}

impl ThreadPool {
    /// Creates a pool of `threads` threads in total (the caller counts as one, so `threads - 1`
    /// workers are spawned). Zero is treated as one.
    pub fn new(threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            wake_lock: Mutex::new(()),
            wake: Condvar::new(),
            caller_waiting: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("trident-pool-{index}"))
                    .spawn(move || worker_loop(&shared))
                    .expect("the OS refused to spawn a thread-pool worker")
            })
            .collect();
        ThreadPool { shared, workers, busy: AtomicBool::new(false) }
    }

    /// Total threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `task(i)` exactly once for every `i` in `0..tasks`, spread over the caller and the
    /// workers, and returns when all have finished. A panic in any task is re-raised here after
    /// the others finished. Nested or concurrent calls run serially on the calling thread.
    pub fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let parallel = tasks > 1
            && !self.workers.is_empty()
            && self.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
        if !parallel {
            // Same contract as the parallel path: every task runs, then the first panic is
            // re-raised.
            let mut first_panic = None;
            for index in 0..tasks {
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| task(index))) {
                    first_panic.get_or_insert(payload);
                }
            }
            if let Some(payload) = first_panic {
                resume_unwind(payload);
            }
            return;
        }

        let job =
            Job { task, tasks, next: AtomicUsize::new(0), finished: AtomicUsize::new(0), panic: Mutex::new(None) };
        let shared = &*self.shared;
        shared.job.store(&job as *const Job<'_> as *mut Job<'static>, Ordering::SeqCst);
        shared.announce();
        job.work(shared);
        self.wait_finished(&job);

        // Retire the job: after the pointer is cleared no worker can pick it up, and once
        // `active` drains no worker still holds it, so it may leave the stack.
        shared.job.store(std::ptr::null_mut(), Ordering::SeqCst);
        let mut spins = 0u32;
        while shared.active.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 1024 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.busy.store(false, Ordering::Release);

        if let Some(payload) = job.panic.into_inner().unwrap_or_else(|p| p.into_inner()) {
            resume_unwind(payload);
        }
    }

    /// Waits until every task of `job` finished: spin briefly, then block on `done`.
    fn wait_finished(&self, job: &Job<'_>) {
        if spin_until(|| job.all_finished()) {
            return;
        }
        let shared = &*self.shared;
        let mut guard = lock(&shared.done_lock);
        // Same handshake as the workers' sleep: flag first, then re-check, both SeqCst.
        shared.caller_waiting.store(true, Ordering::SeqCst);
        while !job.all_finished() {
            guard = shared.done.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
        shared.caller_waiting.store(false, Ordering::SeqCst);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.announce();
        for worker in self.workers.drain(..) {
            // A worker only panics if the runtime is broken; there is nothing left to clean up.
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(threads);
            assert_eq!(pool.threads(), threads);
            for tasks in [0, 1, 2, 3, 17, 1000] {
                let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(tasks, &|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn nested_runs_do_not_deadlock() {
        let pool = ThreadPool::new(3);
        let total = AtomicUsize::new(0);
        pool.run(8, &|_| {
            pool.run(5, &|_| {
                pool.run(3, &|_| {
                    total.fetch_add(1, Ordering::Relaxed);
                });
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 8 * 5 * 3);
    }

    #[test]
    fn concurrent_callers_do_not_deadlock() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    for _ in 0..2000 {
                        pool.run(4, &|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 2000 * 4);
    }

    #[test]
    fn panics_propagate_after_all_tasks_finished() {
        let pool = ThreadPool::new(2);
        let ran = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i % 7 == 3 {
                    panic!("task {i} failed on purpose");
                }
            });
        }));
        let payload = result.expect_err("the task panic must reach the caller");
        let message = payload.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("failed on purpose"), "{message}");
        assert_eq!(ran.load(Ordering::Relaxed), 64);
        // The pool must still work afterwards.
        let after = AtomicUsize::new(0);
        pool.run(10, &|_| {
            after.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(after.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn panics_propagate_from_serial_runs_too() {
        let pool = ThreadPool::new(1);
        let ran = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(5, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert!(i != 1, "serial task failed on purpose");
            });
        }));
        assert!(result.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn many_tiny_runs_are_fast_and_correct() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        let start = Instant::now();
        for _ in 0..100_000 {
            pool.run(2, &|i| {
                total.fetch_add(i + 1, Ordering::Relaxed);
            });
        }
        let elapsed = start.elapsed();
        assert_eq!(total.load(Ordering::Relaxed), 100_000 * 3);
        // About a microsecond per call when both threads are free; the bound leaves room for a
        // loaded machine while still catching a pool that sleeps between calls.
        assert!(elapsed < Duration::from_secs(10), "100k runs took {elapsed:?}");
    }

    #[test]
    fn idle_workers_sleep_and_wake_up() {
        let pool = ThreadPool::new(3);
        let total = AtomicUsize::new(0);
        for _ in 0..3 {
            // Well past the spin window every worker must be blocked, not polling.
            let deadline = Instant::now() + Duration::from_secs(5);
            while pool.shared.sleepers.load(Ordering::SeqCst) < 2 {
                assert!(Instant::now() < deadline, "idle workers never went to sleep");
                std::thread::sleep(Duration::from_millis(1));
            }
            pool.run(6, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 18);
    }
}
