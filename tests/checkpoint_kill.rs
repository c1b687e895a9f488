//! Checkpoints survive SIGKILL at any moment: a run that saves every iteration is killed at
//! pseudo-random points (most land inside a checkpoint write) twenty times; each time `--load`
//! resumes from the last complete checkpoint without error, and every loss the resumed runs log
//! equals the uninterrupted run's bit for bit.

mod common;
use common::*;

/// iteration -> the exact text of its logged loss.
fn losses(path: &Path) -> BTreeMap<u64, String> {
    logged_losses(path).into_iter().collect()
}
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ITERS: usize = 40;

fn flags(data: &str) -> Vec<String> {
    one_thread_train_args(data, 8, ITERS)
}

#[test]
fn sigkill_during_checkpoint_writes_never_breaks_resume() {
    let dir = scratch("sigkill");
    let data = prepared_corpus(&dir);
    let base_json = dir.join("base.jsonl");
    let mut args = flags(&data);
    args.extend(["--log-json".to_string(), base_json.display().to_string()]);
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let base = losses(&base_json);
    assert_eq!(base.len(), 40);

    let ckpt = dir.join("ckpt");
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut kills = 0;
    let mut round = 0;
    let mut resumed_kills = 0;
    // Start-up and iteration times vary with the machine's load, so the kill delay adapts both
    // ways: a kill that lands before training started pushes later kills later, a run that
    // finishes before its kill pulls them earlier.
    let mut base_delay_ms: u64 = 450;
    while kills < 20 || resumed_kills < 10 {
        round += 1;
        assert!(round < 200, "could not land 20 kills, 10 of them in resumed runs, in 200 rounds");
        // Start (or resume) a run that checkpoints every iteration, and kill it after a
        // pseudo-random delay.
        let json = dir.join(format!("run{round}.jsonl"));
        let mut args = flags(&data);
        args.extend(
            ["--save", ckpt.to_str().unwrap(), "--save-interval", "1", "--log-json", json.to_str().unwrap()]
                .map(String::from),
        );
        let resuming = ckpt.join("latest_checkpointed_iteration.txt").exists();
        if resuming {
            args.extend(["--load".to_string(), ckpt.display().to_string()]);
        }
        let mut child = Command::new(BIN).args(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(base_delay_ms + (rng >> 33) % 500);
        let started = Instant::now();
        let finished = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() >= delay {
                break None;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        match finished {
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                let trained = !losses(&json).is_empty();
                resumed_kills += usize::from(resuming && trained);
                if !trained {
                    base_delay_ms += 100;
                }
            }
            Some(status) => {
                base_delay_ms = base_delay_ms.saturating_sub(150).max(100);
                let mut err = String::new();
                std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
                assert!(status.success(), "round {round}: the run failed: {err}");
            }
        }
        // Whatever the resumed run logged matches the uninterrupted run bit for bit.
        for (it, loss) in losses(&json) {
            assert_eq!(Some(&loss), base.get(&it), "round {round}: iteration {it}");
        }
        // Start over once a run reached the end, so that kills keep landing mid-run.
        if finished.is_some() {
            std::fs::remove_dir_all(&ckpt).unwrap();
        }
    }
    // A final resume (if a checkpoint is left) completes the run cleanly.
    if ckpt.join("latest_checkpointed_iteration.txt").exists() {
        let json = dir.join("final.jsonl");
        let mut args = flags(&data);
        args.extend(["--load", ckpt.to_str().unwrap(), "--log-json", json.to_str().unwrap()].map(String::from));
        let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "final resume: {}", stderr(&o));
        for (it, loss) in losses(&json) {
            assert_eq!(Some(&loss), base.get(&it), "final resume: iteration {it}");
        }
    }
}
