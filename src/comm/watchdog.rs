//! `--distributed-timeout-minutes`: a rank that waits on the others (an MPI collective or
//! message, or the device finishing its queued work, NCCL/RCCL collectives included) longer than
//! the timeout stops the whole job with one line naming the wait, as a collective's timeout does
//! in PyTorch, instead of hanging until the allocation runs out. Off (no thread, one relaxed load
//! per wait) until `arm` is called; a build without MPI has no other ranks and never arms it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The timeout in milliseconds; 0: not armed.
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);
/// When the outermost wait began, in milliseconds since `origin()` plus one; 0: not waiting.
static SINCE_MS: AtomicU64 = AtomicU64::new(0);
/// What that wait is, for the error line.
static WHAT: Mutex<&str> = Mutex::new("");

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    origin().elapsed().as_millis() as u64 + 1
}

/// Starts watching this process's waits: one that lasts longer than `timeout` stops the job.
/// `rank` and `flag_minutes` name the rank and the flag's value in the error. Arming again only
/// changes the timeout.
pub fn arm(timeout: Duration, rank: usize, flag_minutes: f64) {
    if !cfg!(feature = "mpi") {
        return;
    }
    let ms = timeout.as_millis().clamp(1, u64::MAX as u128 / 2) as u64;
    let first = TIMEOUT_MS.swap(ms, Ordering::Relaxed) == 0;
    if !first {
        return;
    }
    origin();
    // Checked a few times per timeout, at least once a second.
    let period = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    std::thread::spawn(move || loop {
        std::thread::sleep(period);
        let since = SINCE_MS.load(Ordering::Relaxed);
        let limit = TIMEOUT_MS.load(Ordering::Relaxed);
        if since == 0 || now_ms().saturating_sub(since) <= limit {
            continue;
        }
        let what = *WHAT.lock().unwrap_or_else(|e| e.into_inner());
        eprintln!(
            "trident: error: rank {rank}: {what} has waited on the other ranks for more than \
             --distributed-timeout-minutes {flag_minutes}: a rank is stuck or dead (or slower than that: raise the \
             flag); stopping the job"
        );
        abort();
    });
}

/// Runs `wait` (`what` names it: "an MPI all-reduce"), timed by the watchdog when it is armed.
/// A wait inside another counts as the outer one.
pub fn waiting<T>(what: &'static str, wait: impl FnOnce() -> T) -> T {
    if TIMEOUT_MS.load(Ordering::Relaxed) == 0 {
        return wait();
    }
    let outer = SINCE_MS.compare_exchange(0, now_ms(), Ordering::Relaxed, Ordering::Relaxed).is_ok();
    if outer {
        *WHAT.lock().unwrap_or_else(|e| e.into_inner()) = what;
    }
    let out = wait();
    if outer {
        SINCE_MS.store(0, Ordering::Relaxed);
    }
    out
}

/// Ends every rank of the job through MPI (the launcher kills the others, the stuck one
/// included). The one place library code ends the job: the thread that waits is inside the
/// library call it waits on, so no error can travel back to `main` from it. Without MPI there
/// are no other ranks and `arm` starts no watchdog.
fn abort() -> ! {
    #[cfg(feature = "mpi")]
    // SAFETY: MPI_Initialized may be called at any time; MPI_Abort on the world communicator
    // after a successful initialisation.
    unsafe {
        let mut initialized = 0;
        ::mpi::ffi::MPI_Initialized(&mut initialized);
        if initialized != 0 {
            ::mpi::ffi::MPI_Abort(::mpi::ffi::RSMPI_COMM_WORLD, 1);
        }
    }
    // MPI_Abort does not return; without MPI no watchdog runs.
    unreachable!("the job was aborted")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_inside_another_counts_as_the_outer_one() {
        TIMEOUT_MS.store(60_000, Ordering::Relaxed);
        let inner = waiting("outer", || {
            let started = SINCE_MS.load(Ordering::Relaxed);
            waiting("inner", || assert_eq!(SINCE_MS.load(Ordering::Relaxed), started));
            *WHAT.lock().unwrap()
        });
        assert_eq!(inner, "outer");
        assert_eq!(SINCE_MS.load(Ordering::Relaxed), 0, "the wait is over");
        TIMEOUT_MS.store(0, Ordering::Relaxed);
    }
}
