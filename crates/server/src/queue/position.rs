//! A subscription's position: what its connection has been sent, and where a delivery
//! stands against it.

use std::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering},
    OnceLock,
};

use herald_protocol::Epoch;

use super::{Delivery, Form};

/// A subscription's position: the last offset its connection has been sent, shared by the
/// session (which sets it when subscribing and moves it as its transport writes) and the
/// hub's direct lane (which moves it as it writes). Never both at once: the lane writes
/// only while the transport is idle.
#[derive(Debug, Default)]
pub struct Position {
    epoch: OnceLock<Epoch>,
    offset: AtomicU64,
    /// Whether the subscription takes deltas, and whether its client has a publication's
    /// data to apply the next one to (see [`Form`]).
    deltas: AtomicU8,
    /// Whether publications a later one of the same conflation key replaced while they
    /// waited in the queue are skipped (see [`Queue::superseded`]).
    conflates: AtomicBool,
}

/// [`Position::deltas`]: whole publications only.
const NO_DELTAS: u8 = 0;
/// Deltas asked for; the next live publication goes whole, as the base of the next.
const DELTAS_FROM_NEXT: u8 = 1;
/// Deltas asked for; the client has the previous live publication's data.
const DELTAS: u8 = 2;

/// Where a delivery stands against a subscription's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// At or below the position: already sent (replayed from history).
    Duplicate,
    /// The next offset: send it.
    Next,
    /// The position is not set yet (the subscription is still being made).
    Unset,
    /// Another epoch, or offsets are missing: the client must resume from history.
    Broken(&'static str),
}

impl Position {
    /// Sets where the subscription starts; the epoch is fixed from then on.
    pub fn start(&self, epoch: Epoch, offset: u64) {
        let _ = self.epoch.set(epoch);
        self.set(offset);
    }

    /// Moves the position to `offset`.
    pub fn set(&self, offset: u64) {
        self.offset.store(offset, Ordering::Relaxed);
    }

    /// Live publications go as deltas from now on (after one that goes whole).
    pub fn take_deltas(&self) {
        self.deltas.store(DELTAS_FROM_NEXT, Ordering::Relaxed);
    }

    /// Whether the subscription takes deltas.
    pub fn takes_deltas(&self) -> bool {
        self.deltas.load(Ordering::Relaxed) != NO_DELTAS
    }

    /// Publications replaced while they wait are skipped from now on.
    pub fn conflate(&self) {
        self.conflates.store(true, Ordering::Relaxed);
    }

    /// Whether publications replaced while they wait are skipped.
    pub fn conflates(&self) -> bool {
        self.conflates.load(Ordering::Relaxed)
    }

    /// The client skips to `offset` (the publications up to it were replaced): its
    /// delta base is no longer the previous publication's data, so the next goes whole.
    pub fn skip_to(&self, offset: u64) {
        self.set(offset);
        if self.deltas.load(Ordering::Relaxed) == DELTAS {
            self.deltas.store(DELTAS_FROM_NEXT, Ordering::Relaxed);
        }
    }

    /// The form `d`, the next live publication, goes in: a delta when the client has the
    /// data of the one before and a delta is worth sending.
    pub fn form(&self, d: &Delivery) -> Form {
        match self.deltas.load(Ordering::Relaxed) {
            NO_DELTAS => Form::Plain,
            DELTAS if d.delta().is_some() => Form::Delta,
            _ => Form::Whole,
        }
    }

    /// `d`, the next live publication, has gone to the client (in [`Position::form`]).
    pub fn sent(&self, d: &Delivery) {
        self.set(d.offset);
        if self.deltas.load(Ordering::Relaxed) == DELTAS_FROM_NEXT {
            self.deltas.store(DELTAS, Ordering::Relaxed);
        }
    }

    /// The epoch (once started) and the last offset sent.
    pub fn get(&self) -> Option<(&Epoch, u64)> {
        Some((self.epoch.get()?, self.offset.load(Ordering::Relaxed)))
    }

    /// Where `d` stands against this position.
    pub fn step(&self, d: &Delivery) -> Step {
        let Some((epoch, offset)) = self.get() else {
            return Step::Unset;
        };
        if d.epoch != *epoch {
            Step::Broken("its stream epoch changed")
        } else if d.offset <= offset {
            Step::Duplicate
        } else if d.offset != offset + 1 {
            Step::Broken("a publication is missing")
        } else {
            Step::Next
        }
    }
}
