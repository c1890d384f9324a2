//! How the durable store writes: when its log reaches the disk ([`SyncPolicy`]), and how
//! large its files grow before a new one starts or the index is checkpointed.

/// When a publication written to the log reaches the disk. Whatever the policy, it is in
/// the operating system's hands before it is delivered or acknowledged, so a crash of the
/// process (`kill -9`) loses nothing; the policies differ on a crash of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Every publication is synced alone before it is delivered and acknowledged. Slowest;
    /// a machine crash keeps every epoch.
    Always,
    /// Publications waiting while a sync runs share the next one; each is synced before it
    /// is acknowledged, so a machine crash loses nothing acknowledged. Subscribers get it
    /// while the sync runs (a sync takes a quarter of a millisecond or more when the disk
    /// is idle): a machine crash in that moment may lose a publication someone saw and
    /// nobody was told was stored, so the next start on a restarted machine gives every
    /// stream a new epoch, as with `Interval`.
    Group,
    /// Acknowledged once written; synced within [`StoreOptions::sync_interval`]. A machine
    /// crash may lose what was acknowledged within that interval before it: the next start
    /// sees that the machine restarted and gives every stream a new epoch, so clients are
    /// told (`recovered: false`), and no offset is handed out twice.
    Interval,
    /// Never synced, except before each checkpoint of the index: a machine crash is answered
    /// as with `Interval`.
    None,
}

impl SyncPolicy {
    /// Whether every acknowledged publication is on disk.
    pub fn syncs_before_ack(self) -> bool {
        matches!(self, SyncPolicy::Always | SyncPolicy::Group)
    }

    /// Whether every delivered publication is on disk: otherwise a crash of the machine may
    /// lose one that subscribers saw, and the next start must not hand its offset out again.
    pub fn syncs_before_delivery(self) -> bool {
        self == SyncPolicy::Always
    }
}

/// How the store is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// When an append to the log reaches the disk.
    pub sync: SyncPolicy,
    /// With [`SyncPolicy::Interval`], the longest an acknowledged publication waits to be
    /// synced.
    pub sync_interval: std::time::Duration,
    /// A log segment past this size is closed and a new one started (taken from
    /// [`MIN_SEGMENT_BYTES`] to [`MAX_SEGMENT_BYTES`]): compaction works a file at a time.
    pub segment_bytes: u64,
    /// Bytes of log between checkpoints of the index: at most what an open after a crash
    /// reads.
    pub checkpoint_bytes: u64,
}

/// The size at which a log segment is closed, unless told otherwise.
#[cfg(not(test))]
pub const DEFAULT_SEGMENT_BYTES: u64 = 16 << 20;
/// Small in tests, so that they rotate, checkpoint and compact.
#[cfg(test)]
pub const DEFAULT_SEGMENT_BYTES: u64 = 256 << 10;
/// Bytes of log between checkpoints, unless told otherwise. A checkpoint writes what
/// changed since the last (24 bytes a publication, and each stream touched); at 16 MiB
/// and 10 million kept publications it holds the applier for a few ms (docs/benchmarks.md,
/// "The store at scale").
#[cfg(not(test))]
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 16 << 20;
#[cfg(test)]
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 512 << 10;
/// Smallest segment size taken.
pub const MIN_SEGMENT_BYTES: u64 = 64 << 10;
/// Largest segment size taken: positions in a file are 32-bit.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// How long a publication waits for its sync at most with [`SyncPolicy::Interval`], unless
/// told otherwise.
pub const DEFAULT_SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

impl From<SyncPolicy> for StoreOptions {
    fn from(sync: SyncPolicy) -> Self {
        Self {
            sync,
            sync_interval: DEFAULT_SYNC_INTERVAL,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
        }
    }
}
