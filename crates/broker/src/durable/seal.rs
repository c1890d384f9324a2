//! The seal a clean stop leaves beside the file, so that the next start need not read
//! every page. An open checks the whole file (redb's page checksums, then every record's
//! own) because a damaged page can make redb panic inside a destructor; that reading
//! grows with the history (274 MB: 0.5-1.2 s). But a file closed cleanly is exactly what
//! the last commit left, unless something changed it since: the seal says which run
//! closed it, and is trusted only while the file's change time (`ctime`, which no program
//! can set directly, and which every write, copy, restore or `touch` moves) is older than the
//! seal. A crash leaves no seal (each open removes it), so the next start checks
//! everything; so does one after any change to the file. Removing the seal before a start
//! asks for the full check.

use std::{
    io::{self, Write},
    path::Path,
    time::{Duration, SystemTime},
};

/// The seal, beside the file: the run that closed it cleanly.
pub const SEAL_FILE_NAME: &str = "herald.redb.closed";

/// Whether the file in `dir` is as the clean stop of a run left it; the run, if so. The
/// seal is removed either way: this start is about to change the file. Call it before
/// the file is opened (opening it for writing changes it).
pub(super) fn take(dir: &Path, file: &Path) -> Option<u64> {
    let seal = dir.join(SEAL_FILE_NAME);
    let run = read(&seal, file);
    let _ = std::fs::remove_file(&seal);
    run
}

fn read(seal: &Path, file: &Path) -> Option<u64> {
    let sealed_at = std::fs::metadata(seal).ok()?.modified().ok()?;
    if changed_at(file)? >= sealed_at {
        return None;
    }
    std::fs::read_to_string(seal).ok()?.trim().parse().ok()
}

/// When the file last changed, data or metadata.
fn changed_at(file: &Path) -> Option<SystemTime> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(file).ok()?;
    let nanos = u32::try_from(m.ctime_nsec()).ok()?;
    let secs = u64::try_from(m.ctime()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Seals the file in `dir`, closed cleanly by `run`: written after the file's last change,
/// so the seal's time is later than the file's (rewritten until it is, as the clock may
/// not have moved on since that change: file times are taken from a clock that advances
/// in ticks of a few milliseconds).
pub(super) fn write(dir: &Path, file: &Path, run: u64) -> io::Result<()> {
    let seal = dir.join(SEAL_FILE_NAME);
    let tmp = dir.join(format!("{SEAL_FILE_NAME}.tmp"));
    for _ in 0..100 {
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "{run}")?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &seal)?;
        if read(&seal, file) == Some(run) {
            return std::fs::File::open(dir)?.sync_all();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = std::fs::remove_file(&seal);
    Err(io::Error::other(
        "the clock did not move past the file's last change",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_is_trusted_until_the_file_changes_and_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, b"pages").unwrap();
        assert_eq!(take(dir.path(), &file), None, "no seal");

        write(dir.path(), &file, 7).unwrap();
        assert_eq!(take(dir.path(), &file), Some(7));
        assert_eq!(take(dir.path(), &file), None, "each open takes it");

        write(dir.path(), &file, 8).unwrap();
        std::fs::write(&file, b"pages").unwrap(); // the same bytes, but written again
        assert_eq!(
            take(dir.path(), &file),
            None,
            "a file changed after its seal"
        );

        write(dir.path(), &file, 9).unwrap();
        let copy = dir.path().join("copy");
        std::fs::copy(&file, &copy).unwrap();
        std::fs::rename(&copy, &file).unwrap(); // put back from a copy
        assert_eq!(take(dir.path(), &file), None, "a file put back from a copy");

        let gone = dir.path().join("gone");
        assert!(write(&gone, &file, 10).is_err(), "no directory to seal in");
        assert!(!gone.join(SEAL_FILE_NAME).exists());
    }
}
