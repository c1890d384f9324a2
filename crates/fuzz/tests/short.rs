//! The short fuzz CI runs: every decoder target with a few thousand generated inputs, and
//! the server fuzz with a few hundred rounds. The long runs are `herald-fuzz` (see
//! docs/fuzzing.md). A seed that changes every run explores new inputs each time; a failure
//! prints the seed and the input, so it can be replayed.

use herald_fuzz::{run, server, Target};

fn seed() -> u64 {
    std::env::var("HERALD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

#[test]
fn no_decoder_panics_on_generated_input() {
    herald_fuzz::quiet_panics();
    let seed = seed();
    for target in Target::ALL {
        let inputs = if matches!(target, Target::StoredFile | Target::Pack) {
            2_000
        } else {
            30_000
        };
        let report = run(target, inputs, seed);
        eprintln!("{report}");
        assert_eq!(
            report.panics, 0,
            "seed {seed} (replay: herald-fuzz --threads 1 --seed {seed} --inputs {inputs} {}): {report}",
            target.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_survives_mutated_requests_and_frames() {
    let seed = seed();
    let report = server::fuzz(600, seed).await.unwrap();
    eprintln!("{report}");
    assert!(report.passed(), "seed {seed}: {report}");
}

/// The same on the durable store and on a real Redis (fewer rounds: the memory run has
/// the decoders; these have the engines' paths under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_survives_them_on_the_durable_store_and_on_redis() {
    let seed = seed();
    for engine in [server::Engine::Durable, server::Engine::Redis] {
        let report = server::fuzz_on(engine, 300, seed).await.unwrap();
        eprintln!("{report}");
        assert!(
            report.passed(),
            "seed {seed} (replay: herald-fuzz --engine {} --seed {seed} --server-rounds 300 server): {report}",
            engine.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_backend_neither_hangs_nor_crashes_the_server() {
    let seed = seed();
    let report = herald_fuzz::backend::fuzz(200, seed).await.unwrap();
    eprintln!("{report}");
    assert!(report.passed(), "seed {seed}: {report}");
    // Every hook was asked: the fuzz reached past each one's door.
    for hook in ["/connect", "/subscribe", "/publish", "/rpc", "/refresh"] {
        assert!(
            report.asked.contains_key(hook),
            "{hook} never asked: {report}"
        );
    }
}
