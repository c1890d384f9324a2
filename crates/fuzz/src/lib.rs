//! # herald-fuzz
//!
//! Generated and mutated inputs for every decoder that reads what Herald does not control
//! (client commands, cursors, transport queries, SSE `Last-Event-ID`, Redis messages and
//! replies, stored records, the durable store's checkpoint), and a black-box fuzz of a running server
//! ([`server`]).
//!
//! Inputs come from a small corpus of valid examples per target, mutated by stacked byte
//! edits, dictionary tokens (JSON, RESP, cursor and URL syntax, numbers at the edges) and
//! splices, plus some purely random bytes. A seeded generator makes a run repeatable:
//! `herald-fuzz --seed S --inputs N TARGET` replays the same inputs. Each input runs under
//! `catch_unwind`; a panic that reaches the harness is a finding, reported with its input.
//! Panics that Herald itself contains (redb, read only to move an old data directory over,
//! decodes damaged records with `unwrap`, and the store turns that into an error) are
//! counted apart.

pub mod access;
pub mod backend;
pub mod decoder;
pub mod mutate;
pub mod node;
pub mod pack;
pub mod server;
pub mod targets;
pub mod wal;
pub mod websocket;

use std::{
    panic::{self, AssertUnwindSafe},
    time::{Duration, Instant},
};

pub use targets::Target;

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub target: String,
    pub inputs: u64,
    /// Panics that reached the harness: each is a defect.
    pub panics: u64,
    /// Panics caught inside Herald, where it turns them into errors by design.
    pub contained: u64,
    /// The first panic's message and input, to reproduce it.
    pub first_panic: Option<(String, Vec<u8>)>,
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<14} {:>10} inputs  {:>3} panics  {:>6} contained  {:>8.1} s",
            self.target,
            self.inputs,
            self.panics,
            self.contained,
            self.elapsed.as_secs_f64()
        )?;
        if let Some((message, input)) = &self.first_panic {
            write!(
                f,
                "\n  first panic: {message}\n  input: {:?}",
                String::from_utf8_lossy(input)
            )?;
        }
        Ok(())
    }
}

thread_local! {
    /// Panics the hook saw on this thread, and the last one's message.
    static PANICS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Panics on the fuzzed server's threads (Tokio's workers), which Tokio catches: the
/// connection's task ends and the server goes on, so only this counts them.
static SERVER_PANICS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LAST_SERVER_PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Replaces the panic hook with one that counts and remembers instead of printing, so a
/// run of a million inputs is not a million stack traces; a panic on a Tokio worker (the
/// fuzzed server's) is counted apart.
pub fn quiet_panics() {
    panic::set_hook(Box::new(|info| {
        PANICS.with(|p| p.set(p.get() + 1));
        LAST_PANIC.with(|l| *l.borrow_mut() = Some(info.to_string()));
        let thread = std::thread::current();
        // Tokio names its workers `tokio-rt-worker` (older versions: `tokio-runtime-worker`).
        if thread.name().is_some_and(|n| n.starts_with("tokio-r")) {
            SERVER_PANICS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Ok(mut last) = LAST_SERVER_PANIC.lock() {
                *last = Some(info.to_string());
            }
        }
    }));
}

/// Panics on the fuzzed server's threads during one run.
#[derive(Debug, Clone, Default)]
pub struct ServerPanics {
    pub count: u64,
    /// The last one's message.
    pub last: Option<String>,
}

impl ServerPanics {
    /// Starts counting (with [`quiet_panics`]'s hook): a mark for [`ServerPanics::since`].
    pub fn mark() -> u64 {
        quiet_panics();
        server_panics().0
    }

    /// The server-thread panics since `mark`.
    pub fn since(mark: u64) -> Self {
        let (count, last) = server_panics();
        Self {
            count: count - mark,
            last,
        }
    }
}

impl std::fmt::Display for ServerPanics {
    /// Nothing when there were none; else a line of its own.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.last {
            Some(last) if self.count > 0 => write!(
                f,
                "\n  {} panics on the server's threads; the last: {last}",
                self.count
            ),
            _ => Ok(()),
        }
    }
}

/// Panics on the fuzzed server's threads so far, and the last one's message.
pub fn server_panics() -> (u64, Option<String>) {
    let last = LAST_SERVER_PANIC.lock().ok().and_then(|l| l.clone());
    (
        SERVER_PANICS.load(std::sync::atomic::Ordering::Relaxed),
        last,
    )
}

fn take_panic() -> Option<String> {
    LAST_PANIC.with(|l| l.borrow_mut().take())
}

fn panics_here() -> u64 {
    PANICS.with(std::cell::Cell::get)
}

/// Feeds `inputs` generated inputs to `target`, starting from `seed`.
pub fn run(target: Target, inputs: u64, seed: u64) -> Report {
    let mut decoder = target.decoder();
    let corpus = target.corpus();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut report = Report {
        target: target.name().into(),
        ..Default::default()
    };
    let started = Instant::now();
    let hook_before = panics_here();
    let mut harness_panics = 0;
    // A decoder can abort the process (a panic while unwinding) rather than panic: with
    // HERALD_FUZZ_SAVE set, each input is written there first, so the last one survives.
    let save = std::env::var_os("HERALD_FUZZ_SAVE");
    for _ in 0..inputs {
        let input = mutate::generate(&mut rng, &corpus, target.max_len());
        if let Some(path) = &save {
            let _ = std::fs::write(path, &input);
        }
        report.inputs += 1;
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| decoder(&input)));
        if outcome.is_err() {
            harness_panics += 1;
            if report.first_panic.is_none() {
                let message = take_panic().unwrap_or_else(|| "(no message)".into());
                report.first_panic = Some((message, input));
            }
        }
    }
    report.panics = harness_panics;
    report.contained = (panics_here() - hook_before).saturating_sub(harness_panics);
    report.elapsed = started.elapsed();
    report
}

/// Runs `run` on several threads, each from its own seed, and adds up the reports.
pub fn run_parallel(target: Target, inputs: u64, seed: u64, threads: usize) -> Report {
    let threads = threads.max(1) as u64;
    let share = inputs.div_ceil(threads);
    let started = Instant::now();
    let reports: Vec<Report> = std::thread::scope(|s| {
        let running: Vec<_> = (0..threads)
            .map(|t| {
                let seed = seed.wrapping_add(t.wrapping_mul(0x9e37_79b9));
                s.spawn(move || run(target, share, seed))
            })
            .collect();
        running
            .into_iter()
            .map(|r| r.join().expect("run catches every panic"))
            .collect()
    });
    let mut total = Report {
        target: target.name().into(),
        elapsed: started.elapsed(),
        ..Default::default()
    };
    for r in reports {
        total.inputs += r.inputs;
        total.panics += r.panics;
        total.contained += r.contained;
        total.first_panic = total.first_panic.or(r.first_panic);
    }
    total
}
