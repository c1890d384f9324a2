//! What the kernel says about a process (CPU, memory, threads) and about sockets.

use std::{fs, io, time::Instant};

/// Clock ticks per second of `/proc/PID/stat` times: 100 on every Linux this runs on.
const TICKS_PER_SECOND: f64 = 100.0;
const PAGE: u64 = 4096;

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ProcSample {
    /// User plus system CPU time used so far, seconds.
    pub cpu_seconds: f64,
    /// The system (kernel) part of it: on loopback, sending also runs the receiver's TCP
    /// path, and it is charged here.
    pub system_seconds: f64,
    pub rss_bytes: u64,
    pub threads: u64,
    /// Kernel memory held by all TCP sockets (system-wide), bytes.
    pub tcp_kernel_bytes: u64,
    #[serde(skip)]
    pub at: Instant,
}

pub fn sample(pid: u32) -> io::Result<ProcSample> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which may itself hold spaces and parentheses.
    let rest = &stat[stat.rfind(')').ok_or_else(|| bad("no ) in stat"))? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> io::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| bad("short stat"))
    };
    // stat(5): utime is field 14, stime 15, num_threads 20, rss 24 (1-based, comm = 2).
    let cpu_ticks = field(11)? + field(12)?;
    Ok(ProcSample {
        cpu_seconds: cpu_ticks as f64 / TICKS_PER_SECOND,
        system_seconds: field(12)? as f64 / TICKS_PER_SECOND,
        threads: field(17)?,
        rss_bytes: field(21)? * PAGE,
        tcp_kernel_bytes: tcp_kernel_bytes().unwrap_or(0),
        at: Instant::now(),
    })
}

/// Several processes as one: CPU, memory and threads summed; `None` if any is unreadable
/// (or there are none).
pub fn sample_all(pids: &[u32]) -> Option<ProcSample> {
    let mut samples = pids.iter().map(|p| sample(*p).ok());
    let mut total = samples.next()??;
    for s in samples {
        let s = s?;
        total.cpu_seconds += s.cpu_seconds;
        total.system_seconds += s.system_seconds;
        total.rss_bytes += s.rss_bytes;
        total.threads += s.threads;
    }
    Some(total)
}

/// Percent of the cores this process may run on that `a`..`b` kept busy (the cores of the
/// load, when `a` and `b` sample it: its processes inherit this one's affinity).
pub fn busy_percent(a: &ProcSample, b: &ProcSample) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let wall = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
    (b.cpu_seconds - a.cpu_seconds) / (wall * cores) * 100.0
}

/// `mem` of the TCP line in `/proc/net/sockstat`, in pages, as bytes.
fn tcp_kernel_bytes() -> Option<u64> {
    let text = fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = text.lines().find(|l| l.starts_with("TCP:"))?;
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == "mem" {
            return words.next()?.parse::<u64>().ok().map(|p| p * PAGE);
        }
    }
    None
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Raises this process's open-file limit to its hard limit; returns (soft, hard) after.
/// Child processes (workers, a spawned server) inherit it.
pub fn raise_fd_limit() -> (u64, u64) {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.rss_bytes > 1 << 20, "{s:?}");
        assert!(s.threads >= 1);
        let spin = Instant::now();
        while spin.elapsed().as_millis() < 50 {
            std::hint::black_box(spin.elapsed());
        }
        assert!(sample(std::process::id()).unwrap().cpu_seconds >= s.cpu_seconds);
    }

    #[test]
    fn busy_is_a_share_of_every_core_this_process_may_use() {
        let a = sample(std::process::id()).unwrap();
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        // Half of every core for two seconds.
        let b = ProcSample {
            cpu_seconds: a.cpu_seconds + cores,
            at: a.at + std::time::Duration::from_secs(2),
            ..a
        };
        assert!((busy_percent(&a, &b) - 50.0).abs() < 1e-9);
    }
}
