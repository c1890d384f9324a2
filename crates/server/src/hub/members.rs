//! One fan-out part of a channel's local subscribers: a list a fan-out job can take a
//! snapshot of in O(1), and that a join or a leave changes without copying or scanning the
//! whole of it.
//!
//! Members sit in chunks of [`CHUNK`] behind `Arc`s, with an index from session to place.
//! A job holds the chunk list (one `Arc` clone); a join or leave while a job holds it copies
//! the list of chunk pointers (a 256th of the members) and at most two chunks, instead of
//! every member. A leave finds its member through the index and fills its place with the
//! last member, instead of searching the list.

use std::{collections::HashMap, sync::Arc};

use crate::queue::{Position, Queue};

/// Members per chunk: what a join or leave copies at most per chunk it touches.
const CHUNK: usize = 256;

/// One session's subscription to a channel, as the hub sees it.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub(super) session: u64,
    pub(super) queue: Arc<Queue>,
    pub(super) position: Arc<Position>,
}

/// What a fan-out job walks: the members as they were when it was made.
pub(super) type Snapshot = Arc<Vec<Arc<Vec<Member>>>>;

/// The members of one part, with where each session's member is.
#[derive(Debug, Default)]
pub(super) struct Members {
    /// Every chunk is full but the last, which is never empty.
    chunks: Snapshot,
    /// session → (chunk, slot).
    index: HashMap<u64, (usize, usize)>,
}

impl Members {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub(super) fn contains(&self, session: u64) -> bool {
        self.index.contains_key(&session)
    }

    /// The members now, for a job that walks them later (an `Arc` clone).
    pub(super) fn snapshot(&self) -> Snapshot {
        self.chunks.clone()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Member> {
        walk(&self.chunks)
    }

    /// Adds a member, or replaces the session's member if it has one.
    pub(super) fn insert(&mut self, member: Member) {
        let chunks = Arc::make_mut(&mut self.chunks);
        if let Some(&(c, s)) = self.index.get(&member.session) {
            Arc::make_mut(&mut chunks[c])[s] = member;
            return;
        }
        if chunks.last().is_none_or(|c| c.len() >= CHUNK) {
            chunks.push(Arc::default());
        }
        let c = chunks.len() - 1;
        let chunk = Arc::make_mut(&mut chunks[c]);
        if chunk.len() == chunk.capacity() {
            // Doubling, never past a chunk: a channel of one member (a user's own) holds
            // room for a few, not for 256 (6 KiB).
            // (A chunk copied while a job held it has no spare room, at any length.)
            chunk.reserve_exact(chunk.len().max(4).min(CHUNK - chunk.len()));
        }
        self.index.insert(member.session, (c, chunk.len()));
        chunk.push(member);
    }

    /// Removes the session's member; false if it had none. The last member takes its place.
    pub(super) fn remove(&mut self, session: u64) -> bool {
        let Some((c, s)) = self.index.remove(&session) else {
            return false;
        };
        let chunks = Arc::make_mut(&mut self.chunks);
        let last_chunk = chunks.len() - 1;
        let last = Arc::make_mut(&mut chunks[last_chunk])
            .pop()
            .expect("the last chunk is never empty");
        if last.session != session {
            self.index.insert(last.session, (c, s));
            Arc::make_mut(&mut chunks[c])[s] = last;
        }
        if chunks[last_chunk].is_empty() {
            chunks.pop();
        }
        true
    }
}

/// Every member of a snapshot.
pub(super) fn walk(chunks: &[Arc<Vec<Member>>]) -> impl Iterator<Item = &Member> {
    chunks.iter().flat_map(|c| c.iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(session: u64) -> Member {
        Member {
            session,
            queue: Arc::new(Queue::new(1 << 20)),
            position: Arc::default(),
        }
    }

    fn sessions(m: &Members) -> Vec<u64> {
        let mut all: Vec<u64> = m.iter().map(|m| m.session).collect();
        all.sort_unstable();
        all
    }

    #[test]
    fn joins_and_leaves_keep_every_member_once_and_the_index_true() {
        let mut m = Members::default();
        let n = 3 * CHUNK as u64 + 17;
        for s in 0..n {
            m.insert(member(s));
        }
        assert_eq!(m.len(), n as usize);
        // Leave from the middle, the first chunk, the last one and the very last member.
        let gone = [5, CHUNK as u64 + 3, n - 1, 2 * CHUNK as u64, 0];
        for s in gone {
            assert!(m.remove(s));
            assert!(!m.remove(s), "{s} left twice");
        }
        let want: Vec<u64> = (0..n).filter(|s| !gone.contains(s)).collect();
        assert_eq!(sessions(&m), want);
        for (&s, &(c, i)) in &m.index {
            assert_eq!(m.chunks[c][i].session, s, "index of {s}");
        }
        for c in &m.chunks[..m.chunks.len() - 1] {
            assert_eq!(c.len(), CHUNK, "only the last chunk is partly full");
        }
        for c in m.chunks.iter() {
            assert!(
                c.capacity() <= CHUNK,
                "a chunk holds room for {}",
                c.capacity()
            );
        }
        for s in want {
            assert!(m.remove(s));
        }
        assert!(m.is_empty() && m.chunks.is_empty());
    }

    #[test]
    fn a_snapshot_keeps_what_it_saw_and_changes_copy_only_what_they_touch() {
        let mut m = Members::default();
        for s in 0..(4 * CHUNK as u64) {
            m.insert(member(s));
        }
        let job = m.snapshot();
        m.remove(10);
        m.insert(member(9999));
        assert_eq!(
            walk(&job).count(),
            4 * CHUNK,
            "the job's members are unchanged"
        );
        assert!(walk(&job).any(|x| x.session == 10));
        // Untouched chunks are still shared with the job: not copied.
        assert!(Arc::ptr_eq(&job[1], &m.chunks[1]) && Arc::ptr_eq(&job[2], &m.chunks[2]));
        assert!(
            !Arc::ptr_eq(&job[0], &m.chunks[0]),
            "the chunk that changed was copied"
        );
    }

    #[test]
    fn inserting_a_session_again_replaces_its_member() {
        let mut m = Members::default();
        m.insert(member(1));
        m.insert(member(1));
        assert_eq!(m.len(), 1);
        assert_eq!(m.iter().count(), 1);
    }

    #[test]
    fn a_channel_of_one_member_holds_room_for_a_few_not_a_chunk() {
        let mut m = Members::default();
        m.insert(member(1));
        assert!(m.chunks[0].capacity() <= 4, "{}", m.chunks[0].capacity());
        for s in 2..=CHUNK as u64 + 1 {
            m.insert(member(s));
        }
        assert_eq!(
            m.chunks[0].capacity(),
            CHUNK,
            "grown by doubling to a chunk"
        );
        assert!(m.chunks[1].capacity() <= 4);
    }

    #[test]
    fn a_join_while_a_job_holds_an_almost_full_chunk_grows_it_to_a_chunk_at_most() {
        for members in (CHUNK - 4)..CHUNK {
            let mut m = Members::default();
            for s in 0..members as u64 {
                m.insert(member(s));
            }
            // The job's hold makes the join copy the chunk, and a copy has no spare room.
            let job = m.snapshot();
            m.insert(member(9999));
            assert_eq!(m.len(), members + 1);
            assert!(m.chunks.iter().all(|c| c.capacity() <= CHUNK));
            drop(job);
        }
    }
}
