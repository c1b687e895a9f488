//! Stopping a run before its last iteration so that the job can be requeued: Megatron's
//! `--exit-signal-handler` (SIGUSR1 or SIGTERM: finish the iteration, checkpoint, exit) and
//! `--exit-duration-in-mins` (the same after N minutes). All ranks agree on the stop through one
//! tiny all-reduce per iteration (only when a feature is on), so none is left in a collective.
//! A run stopped this way exits with `REQUEUE_EXIT_CODE` and leaves `STOP_MARKER` beside its
//! checkpoints, so a job script can tell "stopped, requeue me" from "finished" (0) and "failed".

use crate::comm::{Comm, ReduceOp};
use crate::error::{Error, Result};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

/// The exit status of a run that stopped early after saving a checkpoint: sysexits.h's
/// EX_TEMPFAIL ("temporary failure; the user is invited to retry").
pub const REQUEUE_EXIT_CODE: u8 = 75;

/// Written by rank 0 into the `--save` directory after the stop's checkpoint is complete, and
/// removed when a run starts; it names the iteration and the reason. Job scripts read it as well
/// as the exit code, because `srun --kill-on-bad-exit` may end a step with 143 when ranks exit 75
/// a moment apart.
pub const STOP_MARKER: &str = "trident_stopped_for_requeue.txt";

/// The signals `--exit-signal-handler` catches: SIGUSR1 (what the job scripts ask Slurm to send
/// ahead of the time limit) and SIGTERM (Slurm's and PBS's signal at the limit, on scancel or
/// preemption, followed by SIGKILL after a grace period).
pub const STOP_SIGNALS: [i32; 2] = [libc::SIGUSR1, libc::SIGTERM];

/// The last stop signal received (0: none). Written by the handler, read once per iteration.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    RECEIVED.store(signal, Ordering::SeqCst);
}

/// Installs the handler for `STOP_SIGNALS`. SA_RESTART keeps interrupted reads and writes going.
pub fn install_signal_handler() -> Result<()> {
    for signal in STOP_SIGNALS {
        // SAFETY: a zeroed sigaction is valid; the handler only stores to an atomic, which is
        // async-signal-safe; sigemptyset initialises the mask before use.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(Error::Unsupported(format!(
                "--exit-signal-handler: cannot install a handler for {}: {}",
                signal_name(signal),
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// Why a run stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop signal reached at least one rank (the number, when this rank saw it).
    Signal(Option<i32>),
    /// `--exit-duration-in-mins` ran out on at least one rank.
    Duration,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Signal(Some(s)) => write!(f, "{} received (--exit-signal-handler)", signal_name(*s)),
            StopReason::Signal(None) => write!(f, "a stop signal reached another rank (--exit-signal-handler)"),
            StopReason::Duration => write!(f, "--exit-duration-in-mins ran out"),
        }
    }
}

/// The stop conditions of one run, checked once per iteration on every rank.
pub struct StopWatch {
    signals: bool,
    duration_secs: Option<f64>,
    started: Instant,
}

impl StopWatch {
    /// `started` is when `trident train` began on this rank (Megatron counts from the start of
    /// pretraining, start-up included).
    pub fn new(signals: bool, duration_mins: Option<f64>, started: Instant) -> Result<StopWatch> {
        if signals {
            install_signal_handler()?;
        }
        Ok(StopWatch { signals, duration_secs: duration_mins.map(|m| m * 60.0), started })
    }

    pub fn enabled(&self) -> bool {
        self.signals || self.duration_secs.is_some()
    }

    /// This rank's own verdict: 0 (go on), 1 (time is up), or the signal's number.
    fn local_code(&self) -> f64 {
        let signal = if self.signals { RECEIVED.load(Ordering::SeqCst) } else { 0 };
        if signal != 0 {
            signal as f64
        } else if self.duration_secs.is_some_and(|d| self.started.elapsed().as_secs_f64() >= d) {
            1.0
        } else {
            0.0
        }
    }

    /// Whether the job stops now: every rank's verdict, combined by one all-reduce (max) over
    /// the world, so all ranks stop after the same iteration. Collective when enabled.
    pub fn check(&self, world: &dyn Comm) -> Option<StopReason> {
        if !self.enabled() {
            return None;
        }
        let mine = self.local_code();
        let mut code = [mine];
        world.all_reduce(&mut code, ReduceOp::Max);
        // The codes are small whole numbers, exact in f64.
        match code[0] as i32 {
            0 => None,
            1 => Some(StopReason::Duration),
            c => Some(StopReason::Signal((mine as i32 == c).then_some(c))),
        }
    }
}

/// Removes a stale marker from an earlier run (rank 0, at start).
pub fn clear_marker(save: &Path) -> Result<()> {
    let path = save.join(STOP_MARKER);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&path, "remove", e)),
    }
}

/// Writes the marker (rank 0, after the stop's checkpoint is committed), atomically.
pub fn write_marker(save: &Path, iteration: u64, reason: StopReason) -> Result<()> {
    let path = save.join(STOP_MARKER);
    let tmp = save.join(format!(".{STOP_MARKER}.tmp"));
    let text = format!("iteration {iteration}\nreason {reason}\nexit_code {REQUEUE_EXIT_CODE}\n");
    std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, "write", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, "rename", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SelfComm;

    #[test]
    fn duration_and_disabled_watches() {
        let off = StopWatch::new(false, None, Instant::now()).unwrap();
        assert!(!off.enabled() && off.check(&SelfComm).is_none());
        let long = StopWatch::new(false, Some(60.0), Instant::now()).unwrap();
        assert_eq!(long.check(&SelfComm), None);
        let past = Instant::now() - std::time::Duration::from_secs(2);
        let short = StopWatch::new(false, Some(1.0 / 60.0), past).unwrap();
        assert_eq!(short.check(&SelfComm), Some(StopReason::Duration));
    }

    #[test]
    fn a_signal_stops_the_run_and_names_itself() {
        let watch = StopWatch::new(true, None, Instant::now()).unwrap();
        assert_eq!(watch.check(&SelfComm), None);
        // SAFETY: raising a signal whose handler was just installed; it only stores an atomic.
        unsafe { libc::raise(libc::SIGUSR1) };
        let reason = watch.check(&SelfComm).unwrap();
        assert_eq!(reason, StopReason::Signal(Some(libc::SIGUSR1)));
        assert!(reason.to_string().contains("SIGUSR1"));
        RECEIVED.store(0, Ordering::SeqCst);
    }

    #[test]
    fn marker_round_trip() {
        let dir = std::env::temp_dir().join(format!("trident-stop-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_marker(&dir, 12, StopReason::Duration).unwrap();
        let text = std::fs::read_to_string(dir.join(STOP_MARKER)).unwrap();
        assert!(text.starts_with("iteration 12\n") && text.contains("exit_code 75"), "{text}");
        clear_marker(&dir).unwrap();
        clear_marker(&dir).unwrap();
        assert!(!dir.join(STOP_MARKER).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
