//! `herald`: the server and its command-line clients.

mod cli;
mod engine;
mod pubsub;
mod settings;
mod storage;
mod token;
mod top;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let result = match args.command {
        cli::Command::Serve(a) => serve(a),
        cli::Command::Pub(a) => runtime(1).and_then(|rt| rt.block_on(pubsub::publish(a))),
        cli::Command::Sub(a) => runtime(1).and_then(|rt| rt.block_on(pubsub::subscribe(a))),
        cli::Command::Token(a) => token::mint(a),
        cli::Command::Top(a) => runtime(1).and_then(|rt| rt.block_on(top::run(a))),
        cli::Command::Bench(a) => herald_bench::run(*a).map(|()| ExitCode::SUCCESS),
        cli::Command::BenchWorker { spec } => {
            herald_bench::worker::main(&spec).map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("herald: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn runtime(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if workers > 1 {
        b.worker_threads(workers);
    }
    Ok(b.enable_all().build()?)
}

fn serve(args: cli::ServeArgs) -> anyhow::Result<ExitCode> {
    if let Some(port) = &args.port {
        anyhow::bail!(
            "herald serve has no --port: use --listen 127.0.0.1:{port} (or 0.0.0.0:{port} for every interface)"
        );
    }
    let config = settings::load(&args)?;
    if args.print_config {
        let printed = toml::to_string_pretty(&config)?;
        // Checked as `serve` checks it: a configuration it would refuse is refused here too.
        config.validate()?;
        print!("{printed}");
        return Ok(ExitCode::SUCCESS);
    }
    let (mut settings, engine_choice) = config.validate()?;
    settings::init_logging(&settings.config)?;
    log_panics();
    fit_connections_to_descriptors(&mut settings.config);
    let workers = match settings.config.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    size_allocator_threads(workers.max(1));
    // The workers are started with the runtime, so they take the first names; threads the
    // runtime starts later (blocking work) share one name, so `/metrics` shows a row per
    // worker and per fan-out thread, and one for the rest.
    let named = std::sync::atomic::AtomicUsize::new(0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .thread_name_fn(move || {
            let i = named.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i < workers.max(1) {
                format!("{}{i}", herald_server::metrics::WORKER_THREAD)
            } else {
                "herald-blocking".into()
            }
        })
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listen = settings.config.listen;
        let listener = listen_on(listen, settings.config.reuse_port)
            .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
        let stored_in = engine::stored_in(&engine_choice, &settings.config);
        let node = engine::open_node(settings, &engine_choice).await?;
        let shutdown = shutdown_signal()?;
        survive_file_size_limit()?;
        warn_of_a_shared_address(&node.settings.config);
        tracing::info!(
            address = %listener.local_addr()?,
            workers,
            version = env!("CARGO_PKG_VERSION"),
            api = if node.settings.api_keys().next().is_some() { "enabled" } else { "disabled (no api_key)" },
            storage = node.storage,
            stored_in = %stored_in,
            "herald is listening"
        );
        say_what_is_open(&node.settings);
        if let Some(address) = node.settings.config.metrics_listen {
            let metrics = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {address} (metrics_listen): {e}"))?;
            tracing::info!(address = %metrics.local_addr()?, "metrics at /metrics, without a key");
            let served = herald_server::router::serve_metrics(metrics, node.clone());
            tokio::spawn(async move {
                if let Err(e) = served.await {
                    tracing::warn!(error = %e, "the metrics listener stopped");
                }
            });
        }
        herald_server::serve(listener, node.clone(), shutdown).await?;
        // Dropping the last handle closes the data file cleanly.
        drop(node);
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// Tells the operator which namespaces anonymous clients may read or publish to: without
/// token keys every namespace is open to reading, which is right for a demo and wrong for
/// anything private.
fn say_what_is_open(settings: &herald_server::Settings) {
    // With a connect hook, only clients the backend admits without a user are anonymous.
    let keyed = settings.tokens.keyed() || settings.hooks.connect.is_some();
    for (key, url) in settings.config.hooks.urls() {
        tracing::info!("{key}: asking the backend at {url}");
    }
    for (namespace, can) in settings.open_to_anyone() {
        let which = if namespace.is_empty() {
            "channels without a namespace entry ([channels])".to_string()
        } else {
            format!("namespace {namespace}")
        };
        // Publishing is writing: anonymous writers are worth a warning whatever else is set.
        let publish = can.contains(&"publish");
        let can = can.join(", ");
        if publish {
            tracing::warn!("anonymous clients may {can} in {which}; see docs/auth.md");
        } else if keyed {
            tracing::info!("anonymous clients may {can} in {which}");
        } else {
            tracing::warn!(
                "no token keys ([auth]): anonymous clients may {can} in {which}; see docs/auth.md"
            );
        }
    }
}

/// A server on a loopback address usually sits behind a proxy on the same machine. If that
/// proxy is not in `limits.trusted_proxies`, every client it forwards has its address, and
/// the per-address limits meet the whole audience at once (about 450 users at the defaults).
fn warn_of_a_shared_address(config: &herald_server::Config) {
    if config.listen.ip().is_loopback() && config.limits.trusted_proxies.is_empty() {
        tracing::warn!(
            "listening on a loopback address with no limits.trusted_proxies: if a proxy on this machine forwards clients, they all share its address's limits ({} connections); list it in limits.trusted_proxies and have it send X-Forwarded-For (docs/deployment.md)",
            config.limits.connections_per_address
        );
    }
}

/// Panics (defects: each is contained to its connection, see `Session::handle_frame`) go
/// to the log like everything else, so a JSON log stays JSON.
fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(panic = %what, at = %at, "defect: a task panicked; its connection is closed with 3006");
    }));
}

/// Connections the kernel may hold for us before we accept them (it caps this at
/// `net.core.somaxconn`). Tokio's default of 1024 overflows when thousands of clients arrive
/// at once (all reconnecting after a restart), and an overflowed SYN is retried only after a
/// second.
const LISTEN_BACKLOG: u32 = 4096;

fn listen_on(
    address: std::net::SocketAddr,
    reuse_port: bool,
) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if reuse_port {
        #[cfg(unix)]
        socket.set_reuseport(true)?;
    }
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Descriptors kept for the data file, logs, API clients and connections being refused.
const SPARE_DESCRIPTORS: u64 = 256;

/// Raises the open-file limit as far as allowed, and keeps `max_connections` under it: a
/// server out of descriptors can neither accept nor refuse, so clients would hang in the
/// kernel's backlog; under the cap they get 503 with code 106 instead.
fn fit_connections_to_descriptors(config: &mut herald_server::Config) {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) else {
        return;
    };
    let room = soft.saturating_sub(SPARE_DESCRIPTORS) as usize;
    let configured = config.max_connections;
    if configured != 0 && configured <= room {
        return;
    }
    config.max_connections = room;
    // The default asks for more than most machines allow by default: that is worth a line,
    // not a warning. A limit the operator set, or a limit too low to serve, is a warning.
    let asked = configured != herald_server::Config::default().max_connections;
    if asked || room < TOO_FEW_CONNECTIONS {
        tracing::warn!(
            open_files = soft,
            configured,
            max_connections = room,
            "the open-file limit allows only {room} connections; raise it (`ulimit -n 200000`, or LimitNOFILE= in a systemd unit) for more"
        );
    } else {
        tracing::info!(
            open_files = soft,
            max_connections = room,
            "holding at most {room} connections (the open-file limit is {soft}; raise it with `ulimit -n` or LimitNOFILE= for more)"
        );
    }
}

/// Fewer connections than this is a machine that cannot really serve: say so loudly.
const TOO_FEW_CONNECTIONS: usize = 1000;

/// A write past the file-size limit (`ulimit -f`) raises SIGXFSZ, which kills a process by
/// default. Handled, the write fails with EFBIG instead: the store treats it like a full disk
/// (publications refused, health 503, writes retried) and recovers when the limit is raised.
fn survive_file_size_limit() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut too_large = signal(SignalKind::from_raw(libc::SIGXFSZ))?;
        tokio::spawn(async move { while too_large.recv().await.is_some() {} });
    }
    Ok(())
}

/// Registers for SIGTERM and SIGINT now (before the server says it is ready), so a signal
/// that arrives early still shuts down gracefully instead of killing the process.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// jemalloc rather than the system's allocator: a held request makes and frees many small
/// allocations (its head, its session, its answer), and glibc's malloc spent 13 % of a
/// long-poll run; jemalloc's size classes also keep idle connections smaller (see
/// docs/benchmarks.md, "Allocator"). It runs with its background thread (Cargo.toml's
/// `background_threads`), which returns freed memory to the system on time: without it
/// jemalloc purges only while the program allocates, so what a burst freed (a read flood,
/// a reconnect storm) stayed with a server that went quiet after it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// At most one of jemalloc's background threads per runtime worker. jemalloc sizes them by
/// the cores the process may run on and knows nothing of a cgroup's CPU quota, which the
/// runtime's size follows (`available_parallelism` reads it): under a quota of one CPU on
/// a two-core machine it made four (issue #60: the server's threads follow the CPU it is
/// given, so that a second load meets a server sized for its share).
fn size_allocator_threads(workers: usize) {
    use tikv_jemalloc_ctl::max_background_threads;
    let sized = max_background_threads::read()
        .and_then(|now| max_background_threads::write(now.min(workers)));
    if let Err(e) = sized {
        tracing::warn!(error = %e, "could not limit the allocator's background threads");
    }
}
