//! Server and clients on cores of their own (`--server-cores`, `--client-cores`): with both
//! on the same cores, the clients' reading sets the latency they measure, and a server's
//! own threads compete with the load. Pinned with `taskset` (util-linux), every thread of a
//! process at once; threads made later inherit their maker's cores, and a process this
//! tool starts later (its workers) inherits this one's.
//!
//! A server may also be held to a CPU quota (`--server-cgroup`): a cgroup an operator made,
//! as a container runtime does. Unlike an affinity mask a quota leaves every core usable and
//! throttles the whole group once it has used its share of a period, so a server that makes
//! more busy threads than its quota is paused, not slowed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// Where a server runs: on which cores, in which cgroup.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// A `taskset` list: `0`, `0-1`, `0,2`.
    pub cores: Option<String>,
    /// A cgroup's directory (`/sys/fs/cgroup/cpu/NAME` on version 1, `/sys/fs/cgroup/NAME`
    /// on version 2), made beforehand with its quota.
    pub cgroup: Option<PathBuf>,
}

impl Placement {
    /// A command that runs `program` in this place from its first instruction, so that a
    /// server sizes its threads to the cores and quota it is given, as it does when an
    /// operator starts it so; with no place, `program` itself. The process keeps its pid
    /// through the wrappers (each `exec`s the next).
    pub fn command(&self, program: impl Into<OsString>) -> Command {
        let mut argv: Vec<OsString> = Vec::new();
        if let Some(cores) = &self.cores {
            argv.extend(["taskset", "--cpu-list", cores].map(OsString::from));
        }
        argv.push(program.into());
        match &self.cgroup {
            Some(dir) => {
                // The shell enters the cgroup itself ($$ is its pid, which the program keeps).
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(r#"echo $$ > "$0" && exec "$@""#)
                    .arg(dir.join("cgroup.procs"))
                    .args(argv);
                c
            }
            None => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
        }
    }

    /// Moves `pids` (processes started elsewhere: a peer started by hand) here, every
    /// thread. They keep the threads they made for the place they started in.
    pub fn apply(&self, pids: &[u32]) -> anyhow::Result<()> {
        if let Some(cores) = &self.cores {
            pin(pids, cores)?;
        }
        if let Some(dir) = &self.cgroup {
            let procs = dir.join("cgroup.procs");
            for pid in pids {
                std::fs::write(&procs, pid.to_string())
                    .with_context(|| format!("moving process {pid} into {}", procs.display()))?;
            }
        }
        Ok(())
    }
}

/// The CPU quota of the cgroup at `dir`, in CPUs (`1.5`: one and a half CPUs' time a
/// period), read from version 2's `cpu.max` or version 1's `cpu.cfs_quota_us` and
/// `cpu.cfs_period_us`; `None` for no quota or a directory that has neither.
pub fn quota(dir: &Path) -> Option<f64> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (quota, period) = match read("cpu.max") {
        Some(max) => {
            let mut fields = max.split_whitespace();
            (fields.next()?.to_string(), fields.next()?.to_string())
        }
        None => (read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?),
    };
    let quota: f64 = quota.trim().parse().ok().filter(|q: &f64| *q > 0.0)?;
    let period: f64 = period.trim().parse().ok().filter(|p: &f64| *p > 0.0)?;
    Some(quota / period)
}

/// Pins every thread of each of `pids` to `cores` (a `taskset` list: `0`, `0-1`, `0,2`).
pub fn pin(pids: &[u32], cores: &str) -> anyhow::Result<()> {
    for pid in pids {
        let status = Command::new("taskset")
            .args([
                "--all-tasks",
                "--cpu-list",
                "--pid",
                cores,
                &pid.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .status()
            .context("running taskset (util-linux) to pin a process to its cores")?;
        if !status.success() {
            bail!("taskset could not pin process {pid} to cores {cores}");
        }
    }
    Ok(())
}

/// Every core the machine has online, as a `taskset` list (`0-1`).
pub fn online() -> Option<String> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    Some(list.trim().to_string()).filter(|l| !l.is_empty())
}

/// The cores a process may run on now, as the kernel lists them (`Cpus_allowed_list`).
pub fn of(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_started_in_a_cgroup_is_in_it_from_its_first_instruction() {
        // A plain file stands for the cgroup's `cgroup.procs`: what is written to it is the
        // pid that enters, which must be the program's own (it reads its pid itself).
        let dir = tempfile::tempdir().unwrap();
        let place = Placement {
            cores: None,
            cgroup: Some(dir.path().to_path_buf()),
        };
        let out = place
            .command("sh")
            .args(["-c", "echo $$"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let entered = std::fs::read_to_string(dir.path().join("cgroup.procs")).unwrap();
        let own = String::from_utf8(out.stdout).unwrap();
        assert_eq!(entered.trim(), own.trim());
    }

    #[test]
    fn a_quota_is_read_from_either_version() {
        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(v2.path().join("cpu.max"), "150000 100000\n").unwrap();
        assert_eq!(quota(v2.path()), Some(1.5));
        std::fs::write(v2.path().join("cpu.max"), "max 100000\n").unwrap();
        assert_eq!(quota(v2.path()), None);
        let v1 = tempfile::tempdir().unwrap();
        std::fs::write(v1.path().join("cpu.cfs_quota_us"), "100000\n").unwrap();
        std::fs::write(v1.path().join("cpu.cfs_period_us"), "100000\n").unwrap();
        assert_eq!(quota(v1.path()), Some(1.0));
        std::fs::write(v1.path().join("cpu.cfs_quota_us"), "-1\n").unwrap();
        assert_eq!(quota(v1.path()), None);
    }
}
