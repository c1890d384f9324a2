//! The store's file layer. Everything the store does to its files (create, write, sync,
//! rename, delete, list, read) goes through a [`Dir`], so that the crash tests can put a
//! simulated disk under it (`sim_disk`) and cut the power, kill the process, fail a sync,
//! fill the disk or flip a bit at any one of those steps. The only other files are the old
//! database a migration reads (through redb's own I/O) and the boot id.

use std::{
    fs::File,
    io,
    ops::Deref,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::Arc,
};

/// An open file of the store.
pub(crate) trait FileIo: Send + Sync + std::fmt::Debug {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()>;
    /// Bytes it holds.
    fn len(&self) -> io::Result<u64>;
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the file's bytes durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's bytes and its size durable.
    fn sync_all(&self) -> io::Result<()>;
}

/// A shared open file.
pub(crate) type Handle = Arc<dyn FileIo>;

/// What is held while the store is open, so no other process opens it.
pub(crate) type Held = Box<dyn Send + Sync>;

/// A file system.
pub(crate) trait Disk: Send + Sync {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Locks `path` (created if missing) for this process; `None` if another holds it.
    fn lock(&self, path: &Path) -> io::Result<Option<Held>>;
    /// Creates `path` empty (truncating it), open to read and write.
    fn create(&self, path: &Path) -> io::Result<Handle>;
    /// Opens `path` to read.
    fn open(&self, path: &Path) -> io::Result<Handle>;
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn exists(&self, path: &Path) -> bool;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, deletions) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The files in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// This boot of the machine (Linux's `boot_id`); `None` where it is unknown.
    fn boot_id(&self) -> Option<String>;
}

/// The store's directory on a disk. It dereferences to its path, for naming files.
#[derive(Clone)]
pub(crate) struct Dir {
    path: PathBuf,
    disk: Arc<dyn Disk>,
}

impl Deref for Dir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl Dir {
    /// `path` on the operating system's file system.
    pub(crate) fn os(path: &Path) -> Self {
        Self::on(Arc::new(Os), path)
    }

    pub(crate) fn on(disk: Arc<dyn Disk>, path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            disk,
        }
    }

    pub(crate) fn disk(&self) -> &dyn Disk {
        &*self.disk
    }

    /// Makes the directory's entries durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.disk.sync_dir(&self.path)
    }

    /// The files in the directory.
    pub(crate) fn list(&self) -> io::Result<Vec<PathBuf>> {
        self.disk.list(&self.path)
    }

    /// Writes `bytes` as a new file `path`, synced (its name is not: sync the directory).
    pub(crate) fn write_synced(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let file = self.disk.create(path)?;
        file.write_all_at(bytes, 0)?;
        file.sync_all()
    }

    /// Replaces the file `name` with `bytes` in one step: written to `name.tmp`, synced,
    /// renamed over it, and the directory synced, so a crash leaves the old file or the new.
    pub(crate) fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = self.path.join(format!("{name}.tmp"));
        self.write_synced(&tmp, bytes)?;
        self.disk.rename(&tmp, &self.path.join(name))?;
        self.sync()
    }
}

/// Writes a file from its start on, through a buffer (like `BufWriter`, over a [`Handle`]).
pub(crate) struct Appender {
    file: Handle,
    pos: u64,
    buf: Vec<u8>,
}

impl Appender {
    const FLUSH_AT: usize = 1 << 20;

    pub(crate) fn new(file: Handle) -> Self {
        Self {
            file,
            pos: 0,
            buf: Vec::new(),
        }
    }

    pub(crate) fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= Self::FLUSH_AT {
            self.flush()?;
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.file.write_all_at(&self.buf, self.pos)?;
        self.pos += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes what is buffered and syncs the file; the file, to read.
    pub(crate) fn finish(mut self) -> io::Result<Handle> {
        self.flush()?;
        self.file.sync_all()?;
        Ok(self.file)
    }
}

impl io::Write for Appender {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        Appender::write_all(self, bytes)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads a file from its start on, through [`io::Read`] (for `BufReader`).
pub(crate) struct ReadAt {
    file: Handle,
    pos: u64,
    len: u64,
}

impl ReadAt {
    pub(crate) fn new(file: Handle) -> io::Result<Self> {
        let len = file.len()?;
        Ok(Self { file, pos: 0, len })
    }
}

impl io::Read for ReadAt {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min((self.len - self.pos) as usize);
        self.file.read_exact_at(&mut buf[..n], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The operating system's file system.
struct Os;

impl FileIo for File {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, pos)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, pos)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
}

impl Disk for Os {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn lock(&self, path: &Path) -> io::Result<Option<Held>> {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Box::new(file))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    fn create(&self, path: &Path) -> io::Result<Handle> {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Arc::new(file))
    }

    fn open(&self, path: &Path) -> io::Result<Handle> {
        Ok(Arc::new(File::open(path)?))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                files.push(entry.path());
            }
        }
        Ok(files)
    }

    fn boot_id(&self) -> Option<String> {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()
    }
}
