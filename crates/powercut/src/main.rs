//! `herald-powercut BACKING MOUNTPOINT`: mounts BACKING at MOUNTPOINT through FUSE, passing
//! every operation through, and remembers, for every write and truncation not yet made
//! durable by an `fsync`/`fdatasync` of its file, what it overwrote. A line `cut` on stdin
//! is the power going: every such write is undone (newest first), as LazyFS does, the
//! file system is unmounted, and the count is printed. EOF unmounts and keeps everything.
//!
//! The test (`crates/herald/tests/powercut.rs`) runs `herald serve` on the mount, kills it
//! with publishers mid-stream, cuts, and starts Herald again on BACKING. What it does not
//! simulate: creations, renames and deletions are durable at once (a real power cut may
//! take back those not followed by a directory sync; the crash harness in
//! `herald-broker` covers that), and a write is undone whole, never torn.

use std::{
    collections::HashMap,
    ffi::{OsStr, OsString},
    fs::{File, OpenOptions},
    io::BufRead,
    os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use fuse_mt::{
    CallbackResult, CreatedEntry, DirectoryEntry, FileAttr, FileType, FilesystemMT, RequestInfo,
    ResultCreate, ResultEmpty, ResultEntry, ResultOpen, ResultReaddir, ResultSlice, ResultWrite,
};

const TTL: Duration = Duration::from_secs(0);

/// What a write or truncation overwrote: the bytes from `pos` it replaced, and the file's
/// length before it.
struct Undo {
    pos: u64,
    old: Vec<u8>,
    len: u64,
}

#[derive(Default)]
struct State {
    /// Writes not synced yet, by file, oldest first.
    unsynced: HashMap<PathBuf, Vec<Undo>>,
    open: HashMap<u64, File>,
    next_fh: u64,
}

/// Cloned to keep a handle to cut the power with: the clones share their state.
#[derive(Clone)]
struct PowerCut {
    root: PathBuf,
    state: Arc<Mutex<State>>,
}

fn errno(e: std::io::Error) -> libc::c_int {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn attr(meta: &std::fs::Metadata) -> FileAttr {
    let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
    FileAttr {
        size: meta.len(),
        blocks: meta.blocks(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: SystemTime::UNIX_EPOCH,
        kind: if meta.is_dir() {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: meta.rdev() as u32,
        flags: 0,
    }
}

impl PowerCut {
    fn real(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Notes what overwriting `len` bytes at `pos` of `file` (or cutting it to `pos` when
    /// `len` is `None`) replaces, so that a cut can put it back.
    fn remember(
        &self,
        path: &Path,
        file: &File,
        pos: u64,
        len: Option<u64>,
    ) -> std::io::Result<()> {
        let size = file.metadata()?.len();
        let end = len.map_or(size, |n| (pos + n).min(size));
        let mut old = vec![0; end.saturating_sub(pos) as usize];
        file.read_exact_at(&mut old, pos)?;
        let mut state = self.state.lock().unwrap();
        let undo = Undo {
            pos,
            old,
            len: size,
        };
        state
            .unsynced
            .entry(path.to_owned())
            .or_default()
            .push(undo);
        Ok(())
    }

    fn keep(&self, file: File) -> u64 {
        let mut state = self.state.lock().unwrap();
        state.next_fh += 1;
        let fh = state.next_fh;
        state.open.insert(fh, file);
        fh
    }

    fn with_file<T>(
        &self,
        fh: u64,
        f: impl FnOnce(&File) -> Result<T, libc::c_int>,
    ) -> Result<T, libc::c_int> {
        let file = {
            let state = self.state.lock().unwrap();
            state.open.get(&fh).map(File::try_clone)
        };
        match file {
            Some(Ok(file)) => f(&file),
            Some(Err(e)) => Err(errno(e)),
            None => Err(libc::EBADF),
        }
    }

    /// The power goes: every write not synced is undone, newest first; how many.
    fn cut(&self) -> usize {
        let unsynced = std::mem::take(&mut self.state.lock().unwrap().unsynced);
        let mut undone = 0;
        for (path, undos) in unsynced {
            let Ok(file) = OpenOptions::new().write(true).open(self.real(&path)) else {
                continue; // deleted since: its name's removal was durable at once
            };
            for u in undos.into_iter().rev() {
                let _ = file.set_len(u.len.max(u.pos + u.old.len() as u64));
                let _ = file.write_all_at(&u.old, u.pos);
                let _ = file.set_len(u.len);
                undone += 1;
            }
            let _ = file.sync_all();
        }
        undone
    }
}

impl FilesystemMT for PowerCut {
    fn getattr(&self, _: RequestInfo, path: &Path, _: Option<u64>) -> ResultEntry {
        let meta = std::fs::symlink_metadata(self.real(path)).map_err(errno)?;
        Ok((TTL, attr(&meta)))
    }

    fn truncate(&self, _: RequestInfo, path: &Path, _: Option<u64>, size: u64) -> ResultEmpty {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.real(path))
            .map_err(errno)?;
        self.remember(path, &file, size, None).map_err(errno)?;
        file.set_len(size).map_err(errno)
    }

    fn open(&self, _: RequestInfo, path: &Path, flags: u32) -> ResultOpen {
        let file = OpenOptions::new()
            .read(true)
            .write(flags as i32 & libc::O_ACCMODE != libc::O_RDONLY)
            .open(self.real(path))
            .map_err(errno)?;
        Ok((self.keep(file), 0))
    }

    fn read(
        &self,
        _: RequestInfo,
        _: &Path,
        fh: u64,
        offset: u64,
        size: u32,
        callback: impl FnOnce(ResultSlice<'_>) -> CallbackResult,
    ) -> CallbackResult {
        let read = self.with_file(fh, |file| {
            let mut buf = vec![0; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match file.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) => return Err(errno(e)),
                }
            }
            buf.truncate(got);
            Ok(buf)
        });
        match read {
            Ok(buf) => callback(Ok(&buf)),
            Err(e) => callback(Err(e)),
        }
    }

    fn write(
        &self,
        _: RequestInfo,
        path: &Path,
        fh: u64,
        offset: u64,
        data: Vec<u8>,
        _: u32,
    ) -> ResultWrite {
        self.with_file(fh, |file| {
            self.remember(path, file, offset, Some(data.len() as u64))
                .map_err(errno)?;
            file.write_all_at(&data, offset).map_err(errno)?;
            Ok(data.len() as u32)
        })
    }

    fn flush(&self, _: RequestInfo, _: &Path, _: u64, _: u64) -> ResultEmpty {
        Ok(())
    }

    fn release(&self, _: RequestInfo, _: &Path, fh: u64, _: u32, _: u64, _: bool) -> ResultEmpty {
        self.state.lock().unwrap().open.remove(&fh);
        Ok(())
    }

    fn fsync(&self, _: RequestInfo, path: &Path, fh: u64, _: bool) -> ResultEmpty {
        self.with_file(fh, |file| file.sync_data().map_err(errno))?;
        self.state.lock().unwrap().unsynced.remove(path);
        Ok(())
    }

    fn opendir(&self, _: RequestInfo, _: &Path, _: u32) -> ResultOpen {
        Ok((0, 0))
    }

    fn readdir(&self, _: RequestInfo, path: &Path, _: u64) -> ResultReaddir {
        let mut entries = vec![
            DirectoryEntry {
                name: OsString::from("."),
                kind: FileType::Directory,
            },
            DirectoryEntry {
                name: OsString::from(".."),
                kind: FileType::Directory,
            },
        ];
        for entry in std::fs::read_dir(self.real(path)).map_err(errno)? {
            let entry = entry.map_err(errno)?;
            let kind = match entry.file_type().map_err(errno)?.is_dir() {
                true => FileType::Directory,
                false => FileType::RegularFile,
            };
            entries.push(DirectoryEntry {
                name: entry.file_name(),
                kind,
            });
        }
        Ok(entries)
    }

    fn releasedir(&self, _: RequestInfo, _: &Path, _: u64, _: u32) -> ResultEmpty {
        Ok(())
    }

    fn fsyncdir(&self, _: RequestInfo, _: &Path, _: u64, _: bool) -> ResultEmpty {
        Ok(())
    }

    fn mkdir(&self, _: RequestInfo, parent: &Path, name: &OsStr, mode: u32) -> ResultEntry {
        let path = self.real(&parent.join(name));
        std::fs::create_dir(&path).map_err(errno)?;
        let _ = mode;
        let meta = std::fs::metadata(&path).map_err(errno)?;
        Ok((TTL, attr(&meta)))
    }

    fn unlink(&self, _: RequestInfo, parent: &Path, name: &OsStr) -> ResultEmpty {
        let path = parent.join(name);
        std::fs::remove_file(self.real(&path)).map_err(errno)?;
        self.state.lock().unwrap().unsynced.remove(&path);
        Ok(())
    }

    fn rename(
        &self,
        _: RequestInfo,
        parent: &Path,
        name: &OsStr,
        new_parent: &Path,
        new_name: &OsStr,
    ) -> ResultEmpty {
        let (from, to) = (parent.join(name), new_parent.join(new_name));
        std::fs::rename(self.real(&from), self.real(&to)).map_err(errno)?;
        let mut state = self.state.lock().unwrap();
        state.unsynced.remove(&to);
        if let Some(undos) = state.unsynced.remove(&from) {
            state.unsynced.insert(to, undos);
        }
        Ok(())
    }

    fn create(
        &self,
        _: RequestInfo,
        parent: &Path,
        name: &OsStr,
        mode: u32,
        flags: u32,
    ) -> ResultCreate {
        let path = parent.join(name);
        let real = self.real(&path);
        if flags as i32 & libc::O_TRUNC != 0 {
            if let Ok(old) = File::open(&real) {
                self.remember(&path, &old, 0, None).map_err(errno)?;
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(flags as i32 & libc::O_TRUNC != 0)
            .mode(mode)
            .open(&real)
            .map_err(errno)?;
        let meta = file.metadata().map_err(errno)?;
        Ok(CreatedEntry {
            ttl: TTL,
            attr: attr(&meta),
            fh: self.keep(file),
            flags: 0,
        })
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, backing, mountpoint] = &args[..] else {
        eprintln!("usage: herald-powercut BACKING MOUNTPOINT (then `cut` on stdin)");
        std::process::exit(2);
    };
    let fs = PowerCut {
        root: PathBuf::from(backing),
        state: Arc::default(),
    };
    let mounted = fuse_mt::spawn_mount(fuse_mt::FuseMT::new(fs.clone(), 4), mountpoint, &[])
        .unwrap_or_else(|e| {
            eprintln!("cannot mount {mountpoint}: {e}");
            std::process::exit(1);
        });
    println!("mounted");
    for line in std::io::stdin().lock().lines() {
        if line.as_deref().is_ok_and(|l| l.trim() == "cut") {
            let undone = fs.cut();
            drop(mounted);
            println!("cut: {undone} writes not synced undone");
            return;
        }
    }
    drop(mounted);
}
