//! `herald-fuzz`: runs the decoder targets (and the black-box server fuzz) and prints what
//! each found. Exits 1 when any input panicked. See docs/fuzzing.md.

use clap::Parser;
use herald_fuzz::{backend, server, Target};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Targets to run (default: every decoder target, then the server, then the hostile
    /// backend): see docs/fuzzing.md for the names; `server`, `backend`.
    targets: Vec<String>,
    /// Generated inputs per decoder target.
    #[arg(long, default_value_t = 1_000_000)]
    inputs: u64,
    /// Requests, frames and connections sent to the running server.
    #[arg(long, default_value_t = 20_000)]
    server_rounds: u64,
    /// Where the fuzzed server keeps publications: memory, durable or redis (a
    /// `redis-server` is started for the run).
    #[arg(long, default_value = "memory")]
    engine: String,
    /// Sessions against a server whose hooks ask a hostile backend.
    #[arg(long, default_value_t = 2_000)]
    backend_rounds: u64,
    /// Seed of the first thread; the same seed replays the same inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads per decoder target (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Runs the one target named on this input file instead, with the usual panic
    /// output (see HERALD_FUZZ_SAVE in docs/fuzzing.md).
    #[arg(long)]
    replay: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let names: Vec<String> = if args.targets.is_empty() {
        Target::ALL
            .iter()
            .map(|t| t.name().to_string())
            .chain(["server".to_string(), "backend".to_string()])
            .collect()
    } else {
        args.targets.clone()
    };
    if let Some(file) = &args.replay {
        let [name] = &args.targets[..] else {
            anyhow::bail!("--replay needs exactly one target");
        };
        let target =
            Target::from_name(name).ok_or_else(|| anyhow::anyhow!("unknown target {name:?}"))?;
        let input = std::fs::read(file)?;
        target.decoder()(&input);
        println!("{name}: no panic on {}", file.display());
        return Ok(());
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    herald_fuzz::quiet_panics();
    let mut failed = false;
    for name in names {
        if name == "server" {
            let rt = tokio::runtime::Runtime::new()?;
            let engine = server::Engine::from_name(&args.engine)
                .ok_or_else(|| anyhow::anyhow!("unknown engine {:?}", args.engine))?;
            let report = rt.block_on(server::fuzz_on(engine, args.server_rounds, args.seed))?;
            println!("{report}");
            failed |= !report.passed();
            continue;
        }
        if name == "backend" {
            let rt = tokio::runtime::Runtime::new()?;
            let report = rt.block_on(backend::fuzz(args.backend_rounds, args.seed))?;
            println!("{report}");
            failed |= !report.passed();
            continue;
        }
        let Some(target) = Target::from_name(&name) else {
            anyhow::bail!("unknown target {name:?}");
        };
        let report = herald_fuzz::run_parallel(target, args.inputs, args.seed, threads);
        println!("{report}");
        failed |= report.panics > 0;
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
