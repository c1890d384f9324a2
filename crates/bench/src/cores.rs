//! Server and clients on cores of their own (`--server-cores`, `--client-cores`): with both
//! on the same cores, the clients' reading sets the latency they measure, and a server's
//! own threads compete with the load. Pinned with `taskset` (util-linux), every thread of a
//! process at once; threads made later inherit their maker's cores, and a process this
//! tool starts later (its workers) inherits this one's.

use std::process::Command;

use anyhow::{bail, Context};

/// A command that runs `program` on `cores` from its first instruction (`taskset -c`), so
/// that a server sizes its threads to the cores it is given, as it does when an operator
/// starts it so; without cores, `program` itself.
pub fn command(program: impl AsRef<std::ffi::OsStr>, cores: Option<&str>) -> Command {
    match cores {
        Some(cores) => {
            let mut c = Command::new("taskset");
            c.args(["--cpu-list", cores]).arg(program);
            c
        }
        None => Command::new(program),
    }
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

/// The cores a process may run on now, as the kernel lists them (`Cpus_allowed_list`).
pub fn of(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|l| l.trim().to_string())
}
