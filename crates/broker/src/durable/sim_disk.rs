//! A simulated disk for the crash tests (`crash_harness`): files in memory, each with what
//! a reader sees (the page cache) apart from what is durable, and the directory likewise,
//! so that a test can stop the machine or the process at any step and see what an open
//! would find afterwards. At a chosen step it injects one [`Fault`]:
//!
//! - a power cut: of each file's writes since its last sync, any prefix survives (chosen
//!   at random), the last one kept possibly torn at a 512-byte sector; of the creations,
//!   renames and deletions since the last directory sync, any prefix survives (each one
//!   whole, as a journal keeps them); the machine boots again (a new boot id);
//! - a process kill: everything the process wrote survives;
//! - a sync that fails with EIO: the pages it was to write are marked clean without
//!   reaching the disk, as Linux does (PostgreSQL's "fsyncgate"), so no later sync writes
//!   them; reads see them until the machine restarts (a kill keeps them, a power cut not);
//! - a full disk: writes fail with ENOSPC for a few steps, writing nothing.
//!
//! After a power cut or a kill every operation fails, as nothing runs any more; the test
//! then opens the store again on [`SimDisk::restarted`]. A bit flipped at rest is
//! [`SimDisk::flip_bit`]. Every step is counted, so a seed's fault lands on the same step
//! of the same work (threads may still order their steps differently from run to run).

use std::{
    collections::{BTreeMap, HashMap},
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

use parking_lot::Mutex;

use super::disk::{Disk, FileIo, Handle, Held};

/// What goes wrong, once, at a chosen step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    PowerCut,
    Kill,
    SyncFails,
    DiskFull,
}

/// A change to a file, kept until the file is synced.
#[derive(Debug, Clone)]
enum Change {
    Write(u64, Vec<u8>),
    Len(u64),
}

impl Change {
    fn apply(&self, to: &mut Vec<u8>) {
        match self {
            Change::Write(pos, bytes) => {
                let end = *pos as usize + bytes.len();
                if to.len() < end {
                    to.resize(end, 0);
                }
                to[*pos as usize..end].copy_from_slice(bytes);
            }
            Change::Len(len) => to.resize(*len as usize, 0),
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Inode {
    /// What reads see.
    cached: Vec<u8>,
    /// What is on the disk.
    durable: Vec<u8>,
    /// Changes since the last sync, in order.
    unsynced: Vec<Change>,
}

/// A change to the directory: entries set (to an inode) or removed, applied whole.
type Entries = Vec<(PathBuf, Option<u64>)>;

/// What a restart finds: after a kill, the disk as it was (page cache and all); after a
/// power cut, only what reached the disk.
#[derive(Debug, Clone, Default)]
struct Image {
    inodes: HashMap<u64, Inode>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    unsynced_names: Vec<Entries>,
    next_inode: u64,
    boot: u64,
}

#[derive(Debug)]
struct State {
    /// The disk as it is now.
    disk: Image,
    steps: u64,
    fault: Option<(u64, Fault)>,
    /// What happened, for the test's report.
    fired: Option<(u64, Fault, &'static str)>,
    /// Writes left that fail with ENOSPC.
    full_for: u32,
    /// Set once the machine or the process has stopped: what a restart finds.
    stopped: Option<Image>,
    rng: fastrand::Rng,
}

/// Kinds of step, for where a fault may land.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Write,
    Sync,
    Other,
}

pub(crate) struct SimDisk {
    state: Arc<Mutex<State>>,
}

fn stopped() -> io::Error {
    io::Error::other("the simulated machine has stopped")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}", path.display()))
}

impl SimDisk {
    pub(crate) fn new(seed: u64) -> Arc<Self> {
        Self::from_image(
            Image {
                next_inode: 1,
                ..Image::default()
            },
            seed,
        )
    }

    fn from_image(image: Image, seed: u64) -> Arc<Self> {
        let state = State {
            disk: image,
            steps: 0,
            fault: None,
            fired: None,
            full_for: 0,
            stopped: None,
            rng: fastrand::Rng::with_seed(seed),
        };
        Arc::new(Self {
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// Injects `fault` at step `at` (counted from now).
    pub(crate) fn arm(&self, at: u64, fault: Fault) {
        let mut s = self.state.lock();
        s.fault = Some((s.steps + at, fault));
    }

    /// Steps taken so far.
    pub(crate) fn steps(&self) -> u64 {
        self.state.lock().steps
    }

    /// The fault that fired: at which step, which, on what operation.
    pub(crate) fn fired(&self) -> Option<(u64, Fault, &'static str)> {
        self.state.lock().fired
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.state.lock().stopped.is_some()
    }

    /// Stops the machine (a power cut) or the process (a kill) now, unless stopped already.
    pub(crate) fn stop(&self, how: Fault) {
        let mut s = self.state.lock();
        if s.stopped.is_none() {
            s.crash(how);
        }
    }

    /// Whether any file has writes not synced yet.
    pub(crate) fn has_unsynced_writes(&self) -> bool {
        let s = self.state.lock();
        s.disk.inodes.values().any(|i| !i.unsynced.is_empty())
    }

    /// Cuts the power now, losing everything not synced (no write or directory change
    /// since its last sync survives).
    pub(crate) fn cut_power_losing_everything_unsynced(&self) {
        let mut s = self.state.lock();
        s.disk.unsynced_names.clear();
        s.disk.inodes.values_mut().for_each(|i| i.unsynced.clear());
        s.crash(Fault::PowerCut);
    }

    /// The disk as the next boot or process start finds it. Call after [`SimDisk::stop`].
    pub(crate) fn restarted(&self, seed: u64) -> Arc<Self> {
        let image = self.state.lock().stopped.clone().expect("stopped first");
        Self::from_image(image, seed)
    }

    /// Flips one bit of a file at rest, in its bytes up to its last non-zero one (the zeros
    /// a log segment is grown with ahead of its appends hold nothing); which file and bit
    /// the seed says. Returns the file and the byte.
    pub(crate) fn flip_bit(&self) -> Option<(PathBuf, usize)> {
        let mut s = self.state.lock();
        let candidates: Vec<(PathBuf, u64, usize)> = (s.disk.names.iter())
            .filter_map(|(p, ino)| {
                let used = s.disk.inodes[ino].cached.iter().rposition(|b| *b != 0)? + 1;
                Some((p.clone(), *ino, used))
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let (path, ino, used) = candidates[s.rng.usize(..candidates.len())].clone();
        let (byte, bit) = (s.rng.usize(..used), s.rng.u8(..8));
        let inode = s.disk.inodes.get_mut(&ino).unwrap();
        // On the disk, and in the cache if it holds that byte.
        for bytes in [&mut inode.cached, &mut inode.durable] {
            if let Some(b) = bytes.get_mut(byte) {
                *b ^= 1 << bit;
            }
        }
        Some((path, byte))
    }

    fn handle(&self, ino: u64) -> Handle {
        Arc::new(SimFile {
            state: self.state.clone(),
            ino,
        })
    }
}

impl State {
    /// Counts a step and says what it meets: `Ok(Some(fault))` for a crash now, an error
    /// to return instead of doing it, or `Ok(None)`.
    fn step(&mut self, step: Step, what: &'static str) -> io::Result<Option<Fault>> {
        if self.stopped.is_some() {
            return Err(stopped());
        }
        self.steps += 1;
        if let Some((at, fault)) = self.fault {
            if self.steps >= at {
                let lands = match fault {
                    Fault::PowerCut | Fault::Kill => true,
                    Fault::SyncFails => step == Step::Sync,
                    Fault::DiskFull => step == Step::Write,
                };
                if lands {
                    self.fault = None;
                    self.fired = Some((self.steps, fault, what));
                    match fault {
                        Fault::PowerCut | Fault::Kill => return Ok(Some(fault)),
                        Fault::SyncFails => {
                            return Err(io::Error::from_raw_os_error(libc_eio()));
                        }
                        Fault::DiskFull => self.full_for = self.rng.u32(1..=8),
                    }
                }
            }
        }
        if step == Step::Write && self.full_for > 0 {
            self.full_for -= 1;
            return Err(io::Error::from_raw_os_error(libc_enospc()));
        }
        Ok(None)
    }

    /// Stops here, keeping what `how` keeps.
    fn crash(&mut self, how: Fault) {
        if how != Fault::PowerCut {
            // The process stops; the kernel keeps its page cache.
            self.stopped = Some(self.disk.clone());
            return;
        }
        let mut names = self.disk.durable_names.clone();
        let kept = self.rng.usize(..=self.disk.unsynced_names.len());
        for change in &self.disk.unsynced_names[..kept] {
            for (path, ino) in change {
                match ino {
                    Some(ino) => names.insert(path.clone(), *ino),
                    None => names.remove(path),
                };
            }
        }
        let mut inodes = HashMap::new();
        for ino in names.values() {
            let inode = &self.disk.inodes[ino];
            let mut bytes = inode.durable.clone();
            let kept = self.rng.usize(..=inode.unsynced.len());
            for (i, change) in inode.unsynced[..kept].iter().enumerate() {
                match change {
                    // The last write kept may be torn at a sector.
                    Change::Write(pos, data) if i + 1 == kept && self.rng.bool() => {
                        let end = pos + self.rng.u64(..=data.len() as u64);
                        let cut = ((end / 512) * 512).saturating_sub(*pos) as usize;
                        Change::Write(*pos, data[..cut].to_vec()).apply(&mut bytes);
                    }
                    change => change.apply(&mut bytes),
                }
            }
            let inode = Inode {
                cached: bytes.clone(),
                durable: bytes,
                ..Inode::default()
            };
            inodes.insert(*ino, inode);
        }
        self.stopped = Some(Image {
            inodes,
            durable_names: names.clone(),
            names,
            unsynced_names: Vec::new(),
            next_inode: self.disk.next_inode,
            boot: self.disk.boot + 1,
        });
    }

    /// After a step that met a crash: stops, and the operation fails.
    fn crashed(&mut self, how: Fault) -> io::Error {
        self.crash(how);
        stopped()
    }

    fn change(&mut self, ino: u64, change: Change) {
        let inode = self.disk.inodes.get_mut(&ino).unwrap();
        change.apply(&mut inode.cached);
        inode.unsynced.push(change);
    }

    fn rename_entries(&mut self, change: Entries) {
        for (path, ino) in &change {
            match ino {
                Some(ino) => self.disk.names.insert(path.clone(), *ino),
                None => self.disk.names.remove(path),
            };
        }
        self.disk.unsynced_names.push(change);
    }
}

const fn libc_eio() -> i32 {
    5
}

const fn libc_enospc() -> i32 {
    28
}

#[derive(Debug)]
struct SimFile {
    state: Arc<Mutex<State>>,
    ino: u64,
}

impl SimFile {
    fn sync(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        match s.step(Step::Sync, "sync") {
            Ok(Some(how)) => return Err(s.crashed(how)),
            Ok(None) => {}
            Err(e) => {
                if e.raw_os_error() == Some(libc_eio()) {
                    // Marked clean, never written.
                    s.disk.inodes.get_mut(&self.ino).unwrap().unsynced.clear();
                }
                return Err(e);
            }
        }
        let inode = s.disk.inodes.get_mut(&self.ino).unwrap();
        for change in std::mem::take(&mut inode.unsynced) {
            change.apply(&mut inode.durable);
        }
        Ok(())
    }
}

impl FileIo for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        let s = self.state.lock();
        if s.stopped.is_some() {
            return Err(stopped());
        }
        let data = &s.disk.inodes[&self.ino].cached;
        let end = pos as usize + buf.len();
        if end > data.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.copy_from_slice(&data[pos as usize..end]);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let s = self.state.lock();
        if s.stopped.is_some() {
            return Err(stopped());
        }
        Ok(s.disk.inodes[&self.ino].cached.len() as u64)
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        let change = Change::Write(pos, buf.to_vec());
        match s.step(Step::Write, "write")? {
            // A power cut in the middle of the write: it may be torn.
            Some(Fault::PowerCut) => {
                s.change(self.ino, change);
                Err(s.crashed(Fault::PowerCut))
            }
            Some(how) => Err(s.crashed(how)),
            None => {
                s.change(self.ino, change);
                Ok(())
            }
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        let grows = len > s.disk.inodes[&self.ino].cached.len() as u64;
        let step = if grows { Step::Write } else { Step::Other };
        if let Some(how) = s.step(step, "set_len")? {
            return Err(s.crashed(how));
        }
        s.change(self.ino, Change::Len(len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }
}

impl Disk for SimDisk {
    fn create_dir_all(&self, _: &Path) -> io::Result<()> {
        Ok(())
    }

    fn lock(&self, _: &Path) -> io::Result<Option<Held>> {
        Ok(Some(Box::new(())))
    }

    fn create(&self, path: &Path) -> io::Result<Handle> {
        let ino = {
            let mut s = self.state.lock();
            if let Some(how) = s.step(Step::Write, "create")? {
                return Err(s.crashed(how));
            }
            match s.disk.names.get(path).copied() {
                Some(ino) => {
                    s.change(ino, Change::Len(0));
                    ino
                }
                None => {
                    let ino = s.disk.next_inode;
                    s.disk.next_inode += 1;
                    s.disk.inodes.insert(ino, Inode::default());
                    s.rename_entries(vec![(path.to_owned(), Some(ino))]);
                    ino
                }
            }
        };
        Ok(self.handle(ino))
    }

    fn open(&self, path: &Path) -> io::Result<Handle> {
        let ino = {
            let s = self.state.lock();
            if s.stopped.is_some() {
                return Err(stopped());
            }
            *s.disk.names.get(path).ok_or_else(|| not_found(path))?
        };
        Ok(self.handle(ino))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let s = self.state.lock();
        if s.stopped.is_some() {
            return Err(stopped());
        }
        let ino = s.disk.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(s.disk.inodes[ino].cached.clone())
    }

    fn exists(&self, path: &Path) -> bool {
        self.state.lock().disk.names.contains_key(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        if let Some(how) = s.step(Step::Other, "rename")? {
            return Err(s.crashed(how));
        }
        let ino = *s.disk.names.get(from).ok_or_else(|| not_found(from))?;
        s.rename_entries(vec![(from.to_owned(), None), (to.to_owned(), Some(ino))]);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        if let Some(how) = s.step(Step::Other, "remove")? {
            return Err(s.crashed(how));
        }
        if !s.disk.names.contains_key(path) {
            return Err(not_found(path));
        }
        s.rename_entries(vec![(path.to_owned(), None)]);
        Ok(())
    }

    fn sync_dir(&self, _: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        if let Some(how) = s.step(Step::Other, "sync_dir")? {
            return Err(s.crashed(how));
        }
        s.disk.durable_names = s.disk.names.clone();
        s.disk.unsynced_names.clear();
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let s = self.state.lock();
        if s.stopped.is_some() {
            return Err(stopped());
        }
        Ok((s.disk.names.keys())
            .filter(|p| p.parent() == Some(dir))
            .cloned()
            .collect())
    }

    fn boot_id(&self) -> Option<String> {
        Some(format!("simulated-boot-{}", self.state.lock().disk.boot))
    }
}
