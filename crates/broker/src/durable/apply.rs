//! What one commit of the database file writes: the applier's batch of log entries (and
//! trims), in order, in one durable transaction. A channel's publications in a commit are
//! written together, with its stream row once for all of them.

use std::collections::HashMap;

use redb::{Database, Durability, ReadableTable, Table};

use super::applier::Op;
use super::store::{record_crc, stream_crc, APPLIED, PUBLICATIONS, STATE, STREAMS};

type Publications<'t> = Table<'t, (&'static str, u64), (u64, u32, &'static [u8])>;
type Streams<'t> = Table<'t, &'static str, (&'static str, u64, u64, u32)>;

/// A channel's publications of this commit not written yet, oldest first (offset, time,
/// data), and their epoch: the newest one gives the stream's row.
struct Run<'o> {
    epoch: &'o str,
    rows: Vec<(u64, u64, &'o [u8])>,
}

/// Writes `ops` in one durable transaction (whatever the sync policy: the log segments it
/// holds are deleted after it), with the last log entry among them recorded as applied;
/// returns, for every trim, when the oldest publication left was published (`None`: none
/// left).
pub(super) fn apply(db: &Database, ops: &[Op]) -> Result<Vec<Option<u64>>, redb::Error> {
    let mut oldest_left = Vec::new();
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
    {
        let mut pubs = txn.open_table(PUBLICATIONS)?;
        let mut streams = txn.open_table(STREAMS)?;
        // Per channel: the epoch its rows are of (checked once per commit), and the newest
        // offset written with how many the stream keeps.
        let mut epochs: HashMap<&str, &str> = HashMap::new();
        let mut tops: HashMap<&str, (u64, usize)> = HashMap::new();
        // Publications wait here until their channel's next other operation or the end, so
        // that each channel's are written together and its stream row once (it was written
        // for every publication); channels are independent, so only each channel's own
        // order matters.
        let mut runs: HashMap<&str, Run<'_>> = HashMap::new();
        for op in ops {
            if let Some(ch) = op.other_than_publish() {
                if let Some(run) = runs.remove(ch) {
                    write_run(&mut pubs, &mut streams, ch, run)?;
                }
            }
            match op {
                Op::Publish {
                    channel,
                    epoch,
                    offset,
                    at_ms,
                    data,
                    history_size,
                    ..
                } => {
                    let (ch, epoch) = (channel.as_str(), epoch.as_str());
                    if !epochs.contains_key(ch) {
                        let stored = streams.get(ch)?.map(|v| v.value().0.to_owned());
                        if stored.as_deref() != Some(epoch) {
                            // A stream begun again (after a reset or a forget the file has
                            // not seen, as on replay): its old rows are not this epoch's.
                            clear(&mut pubs, ch)?;
                        }
                        epochs.insert(ch, epoch);
                    }
                    let run = runs.entry(ch).or_insert_with(|| Run {
                        epoch,
                        rows: Vec::new(),
                    });
                    run.epoch = epoch;
                    run.rows.push((*offset, *at_ms, &data[..]));
                    tops.insert(ch, (*offset, *history_size));
                }
                Op::Reset {
                    channel,
                    epoch,
                    at_ms,
                    ..
                } => {
                    let (ch, epoch) = (channel.as_str(), epoch.as_str());
                    clear(&mut pubs, ch)?;
                    streams.insert(ch, (epoch, 0, *at_ms, stream_crc(ch, epoch, 0, *at_ms)))?;
                    epochs.insert(ch, epoch);
                    tops.remove(ch);
                }
                Op::Forget { channel, .. } => {
                    let ch = channel.as_str();
                    clear(&mut pubs, ch)?;
                    streams.remove(ch)?;
                    epochs.remove(ch);
                    tops.remove(ch);
                }
                Op::Trim {
                    channel,
                    older_than_ms,
                    ..
                } => {
                    oldest_left.push(trim(&mut pubs, channel.as_str(), *older_than_ms)?);
                }
            }
        }
        for (ch, run) in runs {
            write_run(&mut pubs, &mut streams, ch, run)?;
        }
        for (ch, (top, size)) in tops {
            let keep_from = top.saturating_sub(size as u64) + 1;
            pubs.retain_in((ch, 0)..(ch, keep_from), |_, _| false)?;
        }
        if let Some(last) = ops.iter().filter_map(Op::lsn).max() {
            txn.open_table(STATE)?.insert(APPLIED, last)?;
        }
    }
    txn.commit()?;
    Ok(oldest_left)
}

/// Writes a channel's run, and its stream row once.
fn write_run(
    pubs: &mut Publications<'_>,
    streams: &mut Streams<'_>,
    ch: &str,
    run: Run<'_>,
) -> Result<(), redb::Error> {
    for &(offset, at_ms, data) in &run.rows {
        let crc = record_crc(ch, offset, at_ms, data);
        pubs.insert((ch, offset), (at_ms, crc, data))?;
    }
    if let Some(&(top, at_ms, _)) = run.rows.last() {
        let epoch = run.epoch;
        streams.insert(ch, (epoch, top, at_ms, stream_crc(ch, epoch, top, at_ms)))?;
    }
    Ok(())
}

fn clear(pubs: &mut Publications<'_>, ch: &str) -> Result<(), redb::Error> {
    pubs.retain_in((ch, 0)..=(ch, u64::MAX), |_, _| false)?;
    Ok(())
}

/// Deletes `ch`'s publications older than `older_than_ms`; when the oldest one left was
/// published, if any is left.
fn trim(
    pubs: &mut Publications<'_>,
    ch: &str,
    older_than_ms: u64,
) -> Result<Option<u64>, redb::Error> {
    // Expired publications are the oldest ones: find where they end.
    let mut end = None;
    for entry in pubs.range((ch, 0)..=(ch, u64::MAX))? {
        let (k, v) = entry?;
        if v.value().0 >= older_than_ms {
            end = Some(k.value().1);
            break;
        }
        end = Some(k.value().1 + 1);
    }
    if let Some(end) = end {
        pubs.retain_in((ch, 0)..(ch, end), |_, (at, _, _)| at >= older_than_ms)?;
    }
    let first = pubs.range((ch, 0)..=(ch, u64::MAX))?.next();
    Ok(match first {
        Some(entry) => Some(entry?.1.value().0),
        None => None,
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use herald_protocol::{ChannelName, Epoch};
    use redb::ReadableDatabase;

    use super::*;

    fn publish(lsn: u64, epoch: &Epoch, offset: u64) -> Op {
        Op::Publish {
            lsn,
            channel: ChannelName::new("room").unwrap(),
            epoch: epoch.clone(),
            offset,
            at_ms: offset,
            data: Bytes::from(offset.to_string()),
            history_size: usize::MAX,
        }
    }

    /// Publications wait for their channel's run, but a reset between them still comes
    /// between them: what preceded it is gone, what followed it stays, with its row.
    #[test]
    fn a_reset_inside_a_commit_separates_the_runs_around_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("f.redb")).unwrap();
        let (old, new) = (Epoch::new("old"), Epoch::new("new"));
        let ops = [
            publish(1, &old, 1),
            publish(2, &old, 2),
            Op::Reset {
                lsn: 3,
                channel: ChannelName::new("room").unwrap(),
                epoch: new.clone(),
                at_ms: 9,
            },
            publish(4, &new, 1),
        ];
        apply(&db, &ops).unwrap();
        let read = db.begin_read().unwrap();
        let pubs = read.open_table(PUBLICATIONS).unwrap();
        let rows: Vec<(u64, Vec<u8>)> = pubs
            .range(("room", 0)..=("room", u64::MAX))
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value().1, v.value().2.to_vec())
            })
            .collect();
        assert_eq!(rows, [(1, b"1".to_vec())]);
        let stream = read.open_table(STREAMS).unwrap();
        let row = stream.get("room").unwrap().unwrap();
        assert_eq!((row.value().0, row.value().1), ("new", 1));
        let applied = read.open_table(STATE).unwrap().get(APPLIED).unwrap();
        assert_eq!(applied.unwrap().value(), 4);
    }
}
